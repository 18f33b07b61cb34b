"""``bench/bench_rollouts.py`` runs and counts what it claims (no timing is asserted): every rollout
succeeded and its calls were captured, over the SQLite file and over the store service behind the
delaying relay that stands in for a network."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_rollouts.py"


@pytest.mark.parametrize(
    "options",
    [
        ["--configs", "inproc-1,async-proc-1"],
        ["--configs", "async-proc-2", "--store", "service", "--store-delay", "0.001"],
    ],
    ids=["sqlite", "service behind a relay"],
)
def test_the_rollout_bench_reports_valid_runs(options: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--n", "12", *options], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert [run["config"] for run in report["runs"]] == options[1].split(",")
    for run in report["runs"]:
        assert run["valid"] and run["succeeded"] == 12 and run["captured_llm_calls"] >= 36, run
    if "service" in options:
        assert report["store_delay_s"] == 0.001
        assert all("store_service" in run["cpu_ms_per_rollout"] for run in report["runs"])


def test_a_store_delay_needs_the_store_service() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--store-delay", "0.001"], capture_output=True, text=True)
    assert done.returncode != 0 and "--store-delay needs --store service" in done.stderr
