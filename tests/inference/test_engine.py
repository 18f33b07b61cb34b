"""The in-process engine: batching, logprobs, seeds, stops, weight versions and LoRA."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agentgrad.inference import Engine, RequestError, SamplingParams


def _prompt(engine: Engine, text: str = "What is 2 + 3?") -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def test_greedy_logprob_is_the_max_and_tokens_decode_to_text(engine: Engine) -> None:
    result = engine.generate(_prompt(engine), SamplingParams(max_tokens=12, temperature=0, logprobs=5, ignore_eos=True))
    assert len(result.token_ids) == len(result.logprobs) == 12 and result.finish_reason == "length"
    for token, logprob, top in zip(result.token_ids, result.logprobs, result.top_logprobs, strict=True):
        assert top[0][0] == token and top[0][1] == pytest.approx(logprob)
        assert all(logprob >= alt for _, alt in top)
    assert engine.tokenizer.decode(result.token_ids, skip_special_tokens=True) == result.text
    assert result.model_version == engine.model_version


def test_batched_greedy_equals_solo_greedy(engine: Engine) -> None:
    """Left padding and cache merging must not change what a sequence generates."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    solo = engine.generate(_prompt(engine), params)
    prompts = [_prompt(engine, "x" * i + " hello") for i in range(1, 7)] + [_prompt(engine)]
    futures = [engine.submit(p, params) for p in prompts]
    batched = futures[-1].result()
    assert batched.token_ids == solo.token_ids
    assert batched.logprobs == pytest.approx(solo.logprobs, abs=1e-4)


def test_concurrent_requests_share_forward_passes(engine: Engine) -> None:
    before = engine.forward_steps
    futures = [engine.submit(_prompt(engine), SamplingParams(max_tokens=20, ignore_eos=True, seed=i)) for i in range(8)]
    results = [f.result() for f in futures]
    assert sum(len(r.token_ids) for r in results) == 160
    assert engine.forward_steps - before < 80  # sequential would need 160 forward passes


def test_seed_makes_sampling_reproducible(engine: Engine) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=123, ignore_eos=True)
    assert engine.generate(_prompt(engine), params).token_ids == engine.generate(_prompt(engine), params).token_ids


def _frequencies(logits: list[float], n: int = 20_000, **params: float) -> list[float]:
    """How often the engine's sampler picks each token of one row of ``logits`` over ``n``
    evenly spread draws (a stratified sample of its inverse CDF: frequencies exact to 1/n)."""
    import torch

    from agentgrad.inference.engine import _draw

    rows = torch.tensor([logits] * n)
    chosen = _draw(rows, [SamplingParams(**params)] * n, [(i + 0.5) / n for i in range(n)])  # type: ignore[arg-type]
    return (torch.bincount(chosen, minlength=len(logits)).double() / n).tolist()


def test_sampler_picks_tokens_with_their_probability_after_temperature_top_k_and_top_p() -> None:
    import torch

    logits = [2.0, 1.0, 0.5, 0.0, -1.0, float("-inf")]
    for temperature in (1.0, 0.5, 2.0):
        expected = torch.softmax(torch.tensor(logits) / temperature, -1).tolist()
        assert _frequencies(logits, temperature=temperature) == pytest.approx(expected, abs=1e-3)
    top2 = torch.softmax(torch.tensor(logits[:2]), -1).tolist()
    assert _frequencies(logits, top_k=2) == pytest.approx(top2 + [0.0] * 4, abs=1e-3)
    # probabilities .563 .207 .126 .076 .028 0: top_p .6 keeps the tokens whose likelier mass is < .6
    p = torch.softmax(torch.tensor(logits), -1)
    assert _frequencies(logits, top_p=0.6) == pytest.approx((p[:2] / p[:2].sum()).tolist() + [0.0] * 4, abs=1e-3)
    assert _frequencies(logits, top_p=0.6, top_k=1) == pytest.approx([1.0] + [0.0] * 5)
    assert _frequencies(logits, temperature=1.0)[-1] == 0.0  # a token of probability 0 never comes


def test_rows_of_one_draw_keep_their_own_top_k_and_top_p() -> None:
    """A row without top-k or top-p beside rows with them samples from its whole distribution."""
    import torch

    from agentgrad.inference.engine import _draw

    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0]] * 3)
    rows = [SamplingParams(top_k=1), SamplingParams(), SamplingParams(top_p=0.5)]
    n = 4000
    picks = torch.stack([_draw(logits, rows, [(i + 0.5) / n] * 3) for i in range(n)])  # type: ignore[arg-type]
    assert set(picks[:, 0].tolist()) == {0} and set(picks[:, 2].tolist()) == {0}
    whole = torch.bincount(picks[:, 1], minlength=4).double() / n
    assert whole.tolist() == pytest.approx(torch.softmax(logits[0], -1).tolist(), abs=1e-3)


def test_rows_of_one_batch_sample_under_their_own_settings(engine: Engine) -> None:
    """Greedy, sampled, top-k 1 and logprob-asking requests decoded in one batch each get what
    they asked for: the greedy and top-k 1 rows the argmax, alternatives only where asked."""
    prompt = _prompt(engine)
    greedy = engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    asks = [
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3),
        SamplingParams(max_tokens=8, temperature=1.0, seed=1, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=1.0, top_k=1, ignore_eos=True, logprobs=0),
        SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=2, ignore_eos=True),
    ]
    results = [f.result() for f in [engine.submit(prompt, a) for a in asks]]
    assert results[0].token_ids == results[2].token_ids == greedy.token_ids
    assert results[0].logprobs == pytest.approx(greedy.logprobs, abs=1e-4)
    assert [len(t) for t in results[0].top_logprobs or []] == [3] * 8
    assert results[1].top_logprobs is None and results[2].top_logprobs == [[]] * 8
    assert all(lp <= 0 for r in results for lp in r.logprobs)


def test_stop_strings_and_tokens(engine: Engine) -> None:
    def sample(**kw: object) -> object:  # a fixed seed replays the same tokens until the stop
        return engine.generate(_prompt(engine), SamplingParams(max_tokens=8, seed=7, ignore_eos=True, **kw))

    free = sample()
    k = next(i for i, t in enumerate(free.token_ids) if t not in free.token_ids[:i] and i > 0)
    stop_text = engine.tokenizer.decode(free.token_ids[k : k + 1])
    stopped = sample(stop=[stop_text])
    assert stopped.finish_reason == "stop" and stop_text not in stopped.text
    assert free.text.startswith(stopped.text)
    by_id = sample(stop_token_ids=[free.token_ids[k]])
    assert by_id.token_ids == free.token_ids[: k + 1] and by_id.finish_reason == "stop"


def test_bad_requests_name_the_field(engine: Engine) -> None:
    with pytest.raises(RequestError) as err:
        engine.submit([1] * engine.max_model_len, SamplingParams())
    assert err.value.param == "messages"
    with pytest.raises(RequestError) as err:
        engine.submit([1, 2], SamplingParams(max_tokens=engine.max_model_len))
    assert err.value.param == "max_tokens"
    with pytest.raises(RequestError) as err:
        engine.submit([10**9], SamplingParams())
    assert err.value.param == "prompt"


def test_weight_update_mid_flight_finishes_on_old_weights(tiny_model_dir: Path) -> None:
    import torch

    engine = Engine(tiny_model_dir)
    try:
        prompt = _prompt(engine)
        greedy = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
        before = engine.generate(prompt, greedy)
        started = engine.forward_steps  # ``before`` took steps too: wait for these requests' own
        in_flight = [engine.submit(prompt, greedy) for _ in range(4)]
        while engine.forward_steps < started + 3:
            time.sleep(0.001)
        new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in engine._base.state_dict().items()}
        version = engine.update_weights(new_state)
        assert version == "v1" and engine.model_version == "v1"
        for future in in_flight:  # none failed; all finished on the weights they started on
            result = future.result()
            assert result.model_version == "v0" and result.token_ids == before.token_ids
        after = engine.generate(prompt, greedy)
        assert after.model_version == "v1" and after.logprobs != before.logprobs
        assert engine.update_weights(str(tiny_model_dir), version="restored") == "restored"
        assert engine.generate(prompt, greedy).token_ids == before.token_ids
        with pytest.raises(ValueError, match="unknown parameter"):
            engine.update_weights({"nope.weight": torch.zeros(1)})
        with pytest.raises(ValueError, match="shape mismatch"):
            engine.update_weights({"lm_head.weight": torch.zeros(3, 3)})
        assert engine.model_version == "restored"
    finally:
        engine.close()


def test_lora_load_use_and_unload(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")

    engine = Engine(tiny_model_dir)
    try:
        prompt = _prompt(engine)
        params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
        plain = engine.generate(prompt, params)
        engine.load_lora("sql", tmp_path / "adapter")
        assert engine.loras == ["sql"]
        # A LoRA request and a base request in one batch: each gets its own weights.
        lora_future = engine.submit(prompt, params, lora="sql")
        base_future = engine.submit(prompt, params)
        adapted = lora_future.result()
        assert adapted.lora == "sql" and adapted.logprobs != pytest.approx(plain.logprobs)
        assert adapted.model_version == "sql" and base_future.result().model_version == "v0"  # an adapter is a version
        assert base_future.result().logprobs == pytest.approx(plain.logprobs, abs=1e-4)
        engine.unload_lora("sql")
        assert engine.loras == []
        assert engine.generate(prompt, params).logprobs == pytest.approx(plain.logprobs, abs=1e-4)
        with pytest.raises(RequestError):
            engine.submit(prompt, params, lora="sql")
        with pytest.raises(KeyError):
            engine.unload_lora("sql")
    finally:
        engine.close()


def test_closed_engine_refuses_work(tiny_model_dir: Path) -> None:
    from agentgrad.inference import EngineError

    engine = Engine(tiny_model_dir)
    pending = engine.submit(_prompt(engine), SamplingParams(max_tokens=200, ignore_eos=True))
    done = threading.Event()
    pending.add_done_callback(lambda f: done.set())
    engine.close()
    assert done.wait(10)
    with pytest.raises(EngineError):
        engine.submit(_prompt(engine), SamplingParams())
