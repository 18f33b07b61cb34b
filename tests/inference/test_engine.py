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
