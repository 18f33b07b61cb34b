"""The SQL scenario learns: ``make example-sql``'s run — the LangGraph agent on the SQL model
(``tiny-sql``), ``examples/sql/train.yaml``, the world with 200 training databases — lifts greedy
execution accuracy on the 120 held-out test questions, and never trains on the checker's calls
(about 13 minutes on 2 cores; run with -m slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("langgraph", reason="LangGraph is installed by `make frameworks`")

from agentgrad.cli import main  # noqa: E402
from agentgrad.scenarios.sql.world import WorldConfig, write_world  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sql"


@pytest.mark.slow
def test_the_sql_agent_learns_and_the_checker_is_not_trained(tmp_path: Path) -> None:
    world = tmp_path / "world"
    write_world(world, WorldConfig(train_databases=200))
    out = tmp_path / "run"
    code = main(
        [
            "train",
            f"{EXAMPLE / 'sql_agent.py'}:sql_agent",
            "--model",
            "tiny-sql",
            "--config",
            str(EXAMPLE / "train.yaml"),
            *("--tasks", str(world / "train.jsonl"), "--val", str(world / "val.jsonl")),
            *("--test", str(world / "test.jsonl"), "--output-dir", str(out)),
        ]
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    test = summary["test"]
    assert max(test["final"], test["best"]) >= test["start"] + 0.10, test
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [m for m in metrics if "adapter/calls" in m]
    assert sum(m["adapter/calls_other_agents"] for m in trained) > 0  # the checker spoke, and was left out
