"""The framework renderings the tiny model is warmed up on: complete, and what the frameworks send."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from agentgrad.demo import calc, tiny
from agentgrad.demo.renderings import FRAMEWORKS, HELD_OUT, SYSTEM_PROMPTS, TOOL_SCHEMAS, Rendering

CAPTURE_SCRIPT = Path(__file__).parents[2] / "bench" / "capture_tool_renderings.py"


def _tool_without_description(tool: dict[str, Any]) -> str:
    """The schema as the template writes it (key order kept), the description left out."""
    return json.dumps({**tool, "function": {k: v for k, v in tool["function"].items() if k != "description"}})


def test_each_framework_has_its_rendering() -> None:
    families = {name.split("_")[0] for name in FRAMEWORKS}
    assert {"plain", "langgraph", "langchain", "agents", "autogen"} <= families
    for name, rendering in FRAMEWORKS.items():
        function = rendering.tool["function"]
        assert function["name"] == "calculator", name
        assert function["parameters"]["required"] == ["expression"], name
        assert function["parameters"]["properties"]["expression"]["type"] == "string", name


def test_the_warmup_draws_every_captured_schema_and_system_prompt() -> None:
    mix = tiny.warmup_mix()
    assert abs(sum(w for _, w in mix) - 1) < 1e-9 and all(w > 0 for _, w in mix)
    schemas = {_tool_without_description(r.tool) for r, _ in mix if r.answer_tools}
    assert schemas == {_tool_without_description(t) for t in TOOL_SCHEMAS.values()}
    assert {r.system for r, _ in mix} == set(SYSTEM_PROMPTS)
    # every framework's own combination is trained on (AutoGen's answer turn without tools too) ...
    trained = {(json.dumps(r.tool), r.system, r.answer_tools) for r, _ in mix}
    for name, r in FRAMEWORKS.items():
        assert (json.dumps(r.tool), r.system, True) in trained, name
        if not r.answer_tools:
            assert any(not t.answer_tools and t.system == r.system for t, _ in mix), name
    # ... and the held-out ones are not
    for name, r in HELD_OUT.items():
        assert (json.dumps(r.tool), r.system, True) not in trained, name


def test_answer_turn_without_tools_trains_only_the_answer(tmp_path: Path) -> None:
    """AutoGen's reflection call: the conversation is rendered without tools and only the final
    answer is trained (the tool call in it was made in a prompt that had them)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny.random_tiny_model(tmp_path / "m"))
    problem = calc.generate_problems(1, 0)[0]
    ids, mask = tiny.encode_sample(tokenizer, problem, rendering=Rendering(calc.CALCULATOR_TOOL, None, False))
    assert "# Tools" not in tokenizer.decode(ids) and "<tool_call>" in tokenizer.decode(ids)
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained == calc.final_answer_text(problem["answer"]) + "<|im_end|>"
    # without a system message the template's default system turn starts the conversation
    ids, _ = tiny.encode_sample(tokenizer, problem, rendering=FRAMEWORKS["langgraph_react"])
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_the_renderings_are_what_the_frameworks_send(name: str) -> None:
    """Re-run each framework's agent against a scripted server: the tools (key order included),
    the system prompt and the tools of the answer turn are exactly the recorded rendering."""
    pytest.importorskip("langgraph")
    pytest.importorskip("agents")
    pytest.importorskip("autogen_agentchat")
    spec = importlib.util.spec_from_file_location("capture_tool_renderings", CAPTURE_SCRIPT)
    assert spec is not None and spec.loader is not None
    capture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capture)
    requests = capture.capture(name)
    rendering = FRAMEWORKS[name]
    assert json.dumps(requests[0]["tools"]) == json.dumps([rendering.tool])
    system = [m["content"] for m in requests[0]["messages"] if m["role"] == "system"]
    assert system == ([] if rendering.system is None else [rendering.system])
    if rendering.answer_is_tool_result:
        assert len(requests) == 1  # the framework returns the tool's result without asking the model
    else:
        assert bool(requests[1].get("tools")) == rendering.answer_tools
