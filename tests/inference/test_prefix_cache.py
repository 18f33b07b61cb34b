"""Prompt prefixes computed once: the same tokens and logprobs as prefilling every prompt whole,
far fewer prompt tokens run, and no state kept past the weights it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgrad.inference import Engine, GenerationResult, SamplingParams
from agentgrad.inference.prefix_cache import BLOCK, PrefixCache, common_length

SYSTEM = "You are a careful assistant. Use the calculator for every sum. " * 4
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _tokens(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def _prompts(engine: Engine) -> list[list[int]]:
    """Prompts as a GRPO step sends them: one system turn, four questions, each three times."""
    questions = [_tokens(engine, SYSTEM + f"Question {i}: what is {i} + {i * 7}?") for i in range(4)]
    return [q for q in questions for _ in range(3)]


def _run(engine: Engine, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[GenerationResult]:
    futures = [engine.submit(p, params) for p in prompts]
    return [f.result() for f in futures]


def _assert_same(a: list[GenerationResult], b: list[GenerationResult]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_common_length() -> None:
    assert common_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_length([5], [1]) == 0
    assert common_length([], [1, 2]) == 0
    long = list(range(5000))
    assert common_length(long, long[:4321] + [-1] + long[4322:]) == 4321


def _layers(tokens: int, layers: int = 2):
    import torch

    return [(torch.zeros(1, 1, tokens, 4), torch.zeros(1, 1, tokens, 4)) for _ in range(layers)]


def _blocks(*ids: int) -> list[int]:
    """Tokens in whole lookup blocks: block ``i`` is 16 tokens of its own."""
    return [token for i in ids for token in range(i * BLOCK, (i + 1) * BLOCK)]


def test_prefix_cache_serves_the_longest_prefix_of_the_same_adapter_cropped() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.add(None, _blocks(1, 2, 3), _layers(48))
    cache.add("sql", _blocks(1, 2, 3, 4), _layers(64))
    layers, length = cache.longest(None, _blocks(1, 2) + [48, 49, -1], limit=100)
    assert length == 34 and layers[0][0].shape[2] == 34  # to the token, cropped to the shared ones
    assert cache.longest(None, _blocks(1, 2, 3), limit=20)[1] == 20  # never past the limit
    assert cache.longest("sql", _blocks(1, 2, 3, 4, 5), limit=999)[1] == 64
    assert cache.longest("other", _blocks(1, 2), limit=999) == ([], 0)
    assert cache.longest(None, _blocks(7, 1, 2), limit=999) == ([], 0)
    assert cache.longest(None, _blocks(1)[:15], limit=999) == ([], 0)  # less than a block is not looked up
    cache.add(None, [1, 2, 3], _layers(3))  # nor kept
    assert len(cache) == 2


def test_prefix_cache_keeps_one_entry_per_conversation_and_evicts_least_recently_used() -> None:
    per_token = 2 * 2 * 4 * 4  # keys and values of two layers, four floats each
    cache = PrefixCache(max_bytes=160 * per_token)
    cache.add(None, _blocks(1, 2), _layers(32))
    cache.add(None, _blocks(1, 2, 3, 4), _layers(64))  # extends the first: it replaces it
    assert len(cache) == 1 and cache.nbytes == 64 * per_token
    cache.add(None, _blocks(1, 5, 6), _layers(48))  # shares a block with the first
    cache.longest(None, _blocks(1, 2, 3, 4), limit=64)  # now the most recently used
    cache.add(None, _blocks(7, 8, 9), _layers(48))  # 160 tokens: all three fit
    assert len(cache) == 3
    cache.add(None, _blocks(10), _layers(16))  # 176 > 160: the least recently used goes
    assert len(cache) == 3 and cache.nbytes == 128 * per_token
    assert cache.longest(None, _blocks(1, 5, 6), limit=48)[1] == 16  # block 1 is still held: indexed again
    assert cache.longest(None, _blocks(1, 2, 3, 4), limit=64)[1] == 64
    assert cache.longest(None, _blocks(7, 8, 9), limit=48)[1] == 48
    cache.add(None, _blocks(*range(20, 31)), _layers(176))  # larger than the whole budget: not kept
    assert len(cache) == 3
    cache.add("sql", _blocks(1, 2), _layers(32))
    cache.forget("sql")
    assert cache.longest("sql", _blocks(1, 2), limit=32)[1] == 0 and len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
    assert cache.longest(None, _blocks(1, 2, 3, 4), limit=64) == ([], 0)


def test_a_hash_collision_serves_no_wrong_states() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.add(None, _blocks(1, 2), _layers(32))
    entry = next(iter(cache._entries))
    entry.tokens = _blocks(3, 4)  # what a collision would look like: the index finds tokens that differ
    assert cache.longest(None, _blocks(1, 2), limit=32) == ([], 0)


def test_shared_prefixes_change_no_token_and_run_a_fraction_of_the_prompt(tiny_model_dir: Path) -> None:
    whole, shared = Engine(tiny_model_dir, prefix_caching=False), Engine(tiny_model_dir)
    try:
        prompts = _prompts(whole)
        expected, got = _run(whole, prompts), _run(shared, prompts)
        _assert_same(expected, got)
        total = sum(map(len, prompts))
        assert whole.prefill_tokens == total and whole.reused_prompt_tokens == 0
        assert shared.prefill_tokens + shared.reused_prompt_tokens == total
        assert shared.prefill_tokens < total / 5  # the system turn once, each question once
        # the next turns: each conversation continued, every prompt different, the system turn cached
        tool_says = _tokens(whole, " The tool says 42.")
        follow_ups = [p + r.token_ids + tool_says for p, r in zip(prompts, expected, strict=True)]
        before = shared.prefill_tokens
        _assert_same(_run(whole, follow_ups), _run(shared, follow_ups))
        assert shared.prefill_tokens - before < sum(map(len, follow_ups)) / 2
        # a lone request, then the same one again: its whole prompt was kept
        lone = follow_ups[0] + _tokens(whole, " So the answer is")
        _assert_same(_run(whole, [lone]), _run(shared, [lone]))
        before = shared.prefill_tokens
        _assert_same(_run(whole, [lone]), _run(shared, [lone]))
        assert shared.prefill_tokens - before == 1
    finally:
        whole.close()
        shared.close()


def test_sampled_rows_of_a_shared_prompt_keep_their_own_seeds(tiny_model_dir: Path) -> None:
    whole, shared = Engine(tiny_model_dir, prefix_caching=False), Engine(tiny_model_dir)
    try:
        prompt = _prompts(whole)[0]
        seeded = [SamplingParams(max_tokens=12, seed=i, ignore_eos=True) for i in range(6)]

        def draws(engine: Engine) -> list[GenerationResult]:
            futures = [engine.submit(prompt, params) for params in seeded]
            return [f.result() for f in futures]

        expected, got = draws(whole), draws(shared)
        _assert_same(expected, got)
        assert len({tuple(r.token_ids) for r in got}) > 1
    finally:
        whole.close()
        shared.close()


def test_a_weight_update_or_an_adapter_reload_drops_the_prefixes_it_made_stale(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    for seed, name in ((1, "first"), (2, "second")):
        torch.manual_seed(seed)
        peft_model = get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        )
        with torch.no_grad():
            for param_name, param in peft_model.named_parameters():
                if "lora_B" in param_name:
                    param.normal_(0, 0.5)
        peft_model.save_pretrained(tmp_path / name)

    whole, shared = Engine(tiny_model_dir, prefix_caching=False), Engine(tiny_model_dir)
    try:
        prompt = _prompts(whole)[0]
        before = _run(shared, [prompt])
        state = {k: v + 0.05 * torch.randn_like(v) for k, v in whole._base.state_dict().items()}
        for engine in (whole, shared):
            engine.update_weights(state)
        after = _run(shared, [prompt])
        assert after[0].logprobs != pytest.approx(before[0].logprobs, abs=1e-4)
        _assert_same(_run(whole, [prompt]), after)

        for engine in (whole, shared):
            engine.load_lora("policy", tmp_path / "first")
        first = whole.submit(prompt, GREEDY, lora="policy").result()
        _assert_same([first], [shared.submit(prompt, GREEDY, lora="policy").result()])
        for engine in (whole, shared):  # the same name, new weights: as a trainer publishes
            engine.load_lora("policy", tmp_path / "second")
        expected = whole.submit(prompt, GREEDY, lora="policy").result()
        assert expected.logprobs != pytest.approx(first.logprobs, abs=1e-4)
        _assert_same([expected], [shared.submit(prompt, GREEDY, lora="policy").result()])
        # one admission of a base request and an adapter's, the same prompt: each its own states
        pair = [shared.submit(prompt, GREEDY), shared.submit(prompt, GREEDY, lora="policy")]
        _assert_same([whole.generate(prompt, GREEDY), expected], [f.result() for f in pair])
    finally:
        whole.close()
        shared.close()


def test_prefix_cache_mb_must_not_be_negative(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        Engine(tiny_model_dir, prefix_cache_mb=-1)
