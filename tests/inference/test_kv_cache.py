"""The key-value cache under the installed transformers' name: the same logits as running the whole
sequence, and no deprecation warning (transformers 5 warns on ``past_key_values``)."""

from __future__ import annotations

import logging

import pytest

from agentgrad.inference.kv_cache import cache_kwargs, cache_name, prefix_cache

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_name_is_the_one_the_installed_transformers_outputs():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    assert cache_name() in CausalLMOutputWithPast.__dataclass_fields__


def test_a_shared_prefix_run_once_gives_the_logits_of_each_whole_row(tiny_model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prefix = torch.tensor([list(range(3, 20))])
    rows = torch.tensor([[30, 31, 32], [40, 41, 42]])
    # transformers logs its deprecation once per process: forget earlier ones, and listen where it logs
    getattr(logging.Logger.warning_once, "cache_clear", lambda: None)()
    records = _Records()
    listened = logging.getLogger("transformers")
    listened.addHandler(records)
    try:
        with torch.no_grad():
            kv_cache = prefix_cache(model, prefix, rows.shape[0])
            attention = torch.ones((2, prefix.shape[1] + rows.shape[1]), dtype=torch.long)
            cached = model(input_ids=rows, attention_mask=attention, use_cache=True, **cache_kwargs(kv_cache)).logits
            whole = model(input_ids=torch.cat([prefix.repeat(2, 1), rows], dim=1)).logits[:, -rows.shape[1] :]
    finally:
        listened.removeHandler(records)
    torch.testing.assert_close(cached, whole, rtol=1e-4, atol=1e-4)
    assert not [m for m in records.messages if "deprecated" in m], records.messages
