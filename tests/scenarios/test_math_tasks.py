"""`agentgrad scenarios math generate`: the calculator demo's problems as task files for examples/math."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgrad.cli import main
from agentgrad.demo.calc import generate_problems


def test_generate_writes_the_demo_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "scenarios",
                "math",
                "generate",
                str(tmp_path),
                "--seed",
                "2",
                "--train",
                "20",
                "--val",
                "5",
                "--test",
                "7",
            ]
        )
        == 0
    )
    assert "test: 7 tasks" in capsys.readouterr().out
    written = {
        split: [json.loads(line) for line in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
        for split in ("train", "val", "test")
    }
    assert written["test"] == generate_problems(7, 2, "test")  # the demo's own generator, not a copy
    assert len(written["train"]) == 20 and len(written["val"]) == 5
    questions = [{t["question"] for t in tasks} for tasks in written.values()]
    assert not (questions[0] & questions[1] or questions[0] & questions[2] or questions[1] & questions[2])


def test_generate_refuses_a_bad_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenarios", "math", "generate", str(tmp_path / "out"), "--test", "-1"]) == 1
    assert "--test must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
