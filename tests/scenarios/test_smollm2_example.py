"""examples/smollm2: its task files and its agent (the learning run itself is `make example-smollm2`,
measured in examples/smollm2/README.md).

The tasks are deterministic, the splits share no question and every answer is right; the answer
check reads the last number; the agent runs end to end through the capture proxy on the tiny model
with token ids (any chat model serves it: the tiny one stands in for SmolLM2 here).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from capture_check import Capture, run_and_check

from agentgrad.agents import load_agent

EXAMPLE = Path(__file__).parents[2] / "examples" / "smollm2"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"smollm2_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _split(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_make_tasks_is_deterministic_disjoint_and_right(tmp_path: Path) -> None:
    for out in ("a", "b"):
        subprocess.run([sys.executable, str(EXAMPLE / "make_tasks.py"), str(tmp_path / out)], check=True)
    splits = {name: _split(tmp_path / "a" / f"{name}.jsonl") for name in ("train", "val", "test")}
    assert {name: len(rows) for name, rows in splits.items()} == {"train": 600, "val": 48, "test": 64}
    for name in splits:
        assert (tmp_path / "a" / f"{name}.jsonl").read_bytes() == (tmp_path / "b" / f"{name}.jsonl").read_bytes()
    questions = {name: {str(r["question"]) for r in rows} for name, rows in splits.items()}
    assert not questions["train"] & questions["val"] and not questions["train"] & questions["test"]
    assert not questions["val"] & questions["test"]
    for row in splits["test"]:
        words = str(row["question"]).rstrip("?.").split()
        a, op, b = int(words[-3]), words[-2], int(words[-1])
        assert row["answer"] == (a + b if op in ("+", "plus") else a - b), row


def test_the_answer_is_the_last_number() -> None:
    check = _module("arith_agent").last_number_is
    assert check("18 + 8 = 26", 26) and check("-9", -9) and check("It is 1,200.", 1200)
    assert not check("To solve this problem, we add 18 and", 26) and not check("26 is not it, 25", 26)
    assert not check("", 3)


@pytest.mark.tiny_model  # runs last: see tests/conftest.py
def test_the_agent_through_the_proxy(capture: Capture) -> None:
    tasks = [{"question": "What is 7 + 5?", "answer": 12}, {"question": "How much is 9 minus 4?", "answer": 5}]
    spans = run_and_check(capture, load_agent(f"{EXAMPLE / 'arith_agent.py'}:arith_agent"), tasks=tasks)
    assert len(spans) == 2  # one call per task, captured with token ids (checked by run_and_check)
    for rollout_id in {s.rollout_id for s in spans}:
        assert capture.store.get_rollout(rollout_id).reward in (0.0, 1.0)
