"""The engine's growing key-value cache: decode steps write in place, the batch's rows change with
one copy, and the model sees exactly the states ``DynamicCache`` would give it."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agentgrad.inference import Engine, SamplingParams  # noqa: E402
from agentgrad.inference.batch_cache import HEADROOM, GrowingLayer, batch_cache, states  # noqa: E402
from agentgrad.inference.kv_cache import cache_kwargs  # noqa: E402


def _states(rows: int, tokens: int, fill: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if fill is not None:
        return torch.full((rows, 2, tokens, 4), fill), torch.full((rows, 2, tokens, 4), -fill)
    return torch.randn(rows, 2, tokens, 4), torch.randn(rows, 2, tokens, 4)


def test_decode_steps_write_into_the_same_buffer_until_it_is_full() -> None:
    layer = GrowingLayer()
    prompt = _states(3, 5)
    keys, values = layer.update(*prompt)
    assert keys.shape == (3, 2, 5, 4)
    buffer = keys.untyped_storage().data_ptr()
    written = [prompt]
    for _ in range(HEADROOM):
        written.append(_states(3, 1))
        keys, values = layer.update(*written[-1])
        assert keys.untyped_storage().data_ptr() == buffer  # no copy of the cache
    torch.testing.assert_close(keys, torch.cat([k for k, _ in written], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v for _, v in written], dim=2), rtol=0, atol=0)
    assert layer.get_seq_length() == 5 + HEADROOM
    written.append(_states(3, 1))
    keys, _ = layer.update(*written[-1])  # full: a new buffer, the states carried over
    assert keys.untyped_storage().data_ptr() != buffer
    torch.testing.assert_close(keys, torch.cat([k for k, _ in written], dim=2), rtol=0, atol=0)


def test_states_assigned_from_outside_are_adopted_at_the_next_update() -> None:
    layer = GrowingLayer()
    layer.update(*_states(2, 4))
    replaced = _states(1, 6, fill=1.0)
    layer.keys, layer.values = replaced  # as transformers' own cache methods do
    step = _states(1, 1, fill=2.0)
    keys, values = layer.update(*step)
    torch.testing.assert_close(keys, torch.cat([replaced[0], step[0]], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([replaced[1], step[1]], dim=2), rtol=0, atol=0)


def test_keep_selects_rows_and_drops_leading_positions_and_stays_growable() -> None:
    layer = GrowingLayer()
    prompt = _states(4, 6)
    layer.update(*prompt)
    layer.keep(torch.tensor([3, 1]), 2)
    torch.testing.assert_close(layer.keys, prompt[0][[3, 1], :, 2:], rtol=0, atol=0)
    torch.testing.assert_close(layer.values, prompt[1][[3, 1], :, 2:], rtol=0, atol=0)
    buffer = layer.keys.untyped_storage().data_ptr()
    step = _states(2, 1)
    keys, _ = layer.update(*step)
    assert keys.untyped_storage().data_ptr() == buffer  # the free positions came along
    torch.testing.assert_close(keys, torch.cat([prompt[0][[3, 1], :, 2:], step[0]], dim=2), rtol=0, atol=0)


def test_stack_left_pads_each_part_with_zeros() -> None:
    mine, theirs = GrowingLayer(), GrowingLayer()
    a, b = _states(2, 3, fill=1.0), _states(1, 5, fill=3.0)
    mine.update(*a)
    theirs.update(*b)
    mine.stack(theirs, 5)
    assert mine.keys.shape == (3, 2, 5, 4)
    assert torch.all(mine.keys[:2, :, :2] == 0) and torch.all(mine.values[:2, :, :2] == 0)
    torch.testing.assert_close(mine.keys[:2, :, 2:], a[0], rtol=0, atol=0)
    torch.testing.assert_close(mine.values[2:], b[1], rtol=0, atol=0)
    buffer = mine.keys.untyped_storage().data_ptr()
    mine.update(*_states(3, 1))
    assert mine.keys.untyped_storage().data_ptr() == buffer


def test_states_are_tensors_of_their_own() -> None:
    cache = batch_cache([], 1)
    cache.update(*_states(1, 7), 0)
    [(keys, values)] = states(cache)
    assert keys.is_contiguous() and values.is_contiguous()
    assert keys.untyped_storage().nbytes() == keys.nbytes  # no free positions kept alive


def test_a_model_decoding_on_it_gives_the_logits_of_the_whole_sequence(tiny_model_dir: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    sequence = torch.tensor([list(range(3, 3 + 40)), list(range(50, 50 + 40))])
    with torch.no_grad():
        cache = batch_cache([], 2)
        model(input_ids=sequence[:, :20], use_cache=True, **cache_kwargs(cache))
        steps = []
        for position in range(20, 40):
            out = model(
                input_ids=sequence[:, position : position + 1],
                attention_mask=torch.ones((2, position + 1), dtype=torch.long),
                use_cache=True,
                **cache_kwargs(cache),
            )
            steps.append(out.logits[:, -1])
        whole = model(input_ids=sequence).logits[:, 20:40]
    torch.testing.assert_close(torch.stack(steps, dim=1), whole, rtol=1e-4, atol=1e-4)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)


def test_many_rows_finishing_at_different_steps_match_each_row_alone(tiny_model_dir: Path) -> None:
    """Rows leave the batch (``keep``) and join it (``stack``) while the others decode in place:
    each row's greedy reply is the one it gets alone."""
    engine = Engine(tiny_model_dir, max_batch_size=16)
    try:
        tokenizer = engine.tokenizer
        prompts = [tokenizer.encode(f"{i} plus {i * 3} is", add_special_tokens=False) for i in range(12)]
        params = [SamplingParams(max_tokens=4 + (i * 5) % 23, temperature=0, ignore_eos=True) for i in range(12)]
        together = [f.result() for f in [engine.submit(p, q) for p, q in zip(prompts, params, strict=True)]]
        alone = [engine.generate(p, q) for p, q in zip(prompts, params, strict=True)]
    finally:
        engine.close()
    for x, y in zip(together, alone, strict=True):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
