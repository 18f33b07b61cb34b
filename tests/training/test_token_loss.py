"""Logits only where they are used: the warm-ups' loss (the model's own, and its gradients) and the
policy trainer's logprobs (a plain forward's, at every response token)."""

from __future__ import annotations

import pytest

from agentgrad.inference.kv_cache import cache_kwargs, prefix_cache
from agentgrad.training.token_loss import trained_token_loss


def _batch(vocab: int, seed: int):
    """Rows of different lengths (right-padded), each training a reply at its end; one row trains nothing."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths, replies = [23, 17, 30, 9], [5, 3, 0, 4]
    width = max(lengths)
    input_ids = torch.zeros((len(lengths), width), dtype=torch.long)
    labels = torch.full((len(lengths), width), -100)
    attention = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, (length, reply) in enumerate(zip(lengths, replies, strict=True)):
        ids = torch.randint(0, vocab, (length,), generator=generator)
        input_ids[row, :length] = ids
        attention[row, :length] = 1
        if reply:
            labels[row, length - reply : length] = ids[length - reply :]
    return input_ids, labels, attention


def _grads(model) -> list:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("with_prefix", [False, True], ids=["whole rows", "after a shared prefix"])
def test_the_loss_and_its_gradients_are_the_models_own(model_zoo, kind, with_prefix):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_zoo[kind], dtype=torch.float32)
    model.train()
    input_ids, labels, attention = _batch(model.config.vocab_size, seed=1)
    prefix = torch.tensor([[7, 8, 9, 10, 11, 12]])

    def inputs() -> dict:
        if not with_prefix:
            return {"attention_mask": attention}
        mask = torch.cat([torch.ones((len(input_ids), prefix.shape[1]), dtype=torch.long), attention], dim=1)
        return {"attention_mask": mask, **cache_kwargs(prefix_cache(model, prefix, len(input_ids)))}

    torch.manual_seed(0)
    reference = model(input_ids=input_ids, labels=labels, **inputs()).loss
    reference.backward()
    expected = _grads(model)
    model.zero_grad(set_to_none=True)

    torch.manual_seed(0)
    loss = trained_token_loss(model, input_ids, labels, **inputs())
    loss.backward()
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    got = _grads(model)
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


def test_only_the_trained_columns_get_logits(model_zoo):
    """The point of it: the vocabulary projection sees the columns some row trains, not the prompt's."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_zoo["qwen2"], dtype=torch.float32)
    input_ids, labels, attention = _batch(model.config.vocab_size, seed=2)
    seen: list[int] = []
    hook = model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1]))
    try:
        trained_token_loss(model, input_ids, labels, attention_mask=attention)
    finally:
        hook.remove()
    trained_columns = (labels[:, 1:] != -100).any(dim=0).sum().item()
    assert seen == [trained_columns]
    assert trained_columns < input_ids.shape[1] // 2


@pytest.mark.parametrize("kind", ["qwen2", "gpt2"])
def test_the_policys_logprobs_are_made_at_response_positions_only(model_zoo, kind):
    """The policy trainer's per-token logprobs (PPO, NLL, DPO, TIS) equal a plain forward pass's
    at every response token, and the vocabulary projection sees only the positions that predict
    one: a prompt's logits are never made (of a shared prefix, only its last position's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentgrad.training.policy import Sample, _layout, token_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_zoo[kind], dtype=torch.float32).eval()
    shared = list(range(20, 40))  # a shared prefix long enough to be run once
    samples = [
        Sample(prompt_ids=shared + [50 + i] * (3 + 7 * i), response_ids=[60 + i, 61, 62, 63][: 2 + i]) for i in range(3)
    ]
    batch = _layout(samples, torch.device("cpu"))
    seen: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            logprobs, entropy = token_logprobs(model, batch, with_entropy=True)
    finally:
        hook.remove()
    # The shared prefix's run makes its last position's logits, the batch's those of its response positions.
    assert batch.prefix_ids is not None
    assert seen == [1, len(batch.columns)] and len(batch.columns) < batch.targets.shape[1]
    for row, (sample, start) in enumerate(zip(samples, batch.starts, strict=True)):
        ids = torch.tensor([sample.prompt_ids + sample.response_ids])
        with torch.no_grad():
            full = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
        first = len(sample.prompt_ids) - 1
        expected = [full[first + k, token].item() for k, token in enumerate(sample.response_ids)]
        got = logprobs[row, start : start + len(sample.response_ids)].tolist()
        assert got == pytest.approx(expected, abs=1e-4)
        assert entropy is not None and bool((entropy[row, start : start + len(sample.response_ids)] > 0).all())
