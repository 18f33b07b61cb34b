"""RunLog: every logged step reaches metrics.jsonl, the store and each tracker; it always closes."""

from __future__ import annotations

import json
import math

import pytest

from agentgrad.algorithms.runlog import RunLog, Tracker
from agentgrad.store.memory import MemoryStore


class ListTracker:
    def __init__(self, fail_close: bool = False) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.closed = 0
        self.fail_close = fail_close

    def log(self, step, values):
        self.logged.append((step, dict(values)))

    def close(self):
        self.closed += 1
        if self.fail_close:
            raise RuntimeError("tracker could not close")


def test_each_step_goes_to_the_file_the_store_and_every_tracker(tmp_path):
    store = MemoryStore()
    trackers = [ListTracker(), ListTracker()]
    assert all(isinstance(t, Tracker) for t in trackers)
    with RunLog(tmp_path / "run", store, "r1", trackers) as run_log:
        run_log.log(1, {"loss": 0.5, "tokens": 12})
        run_log.log(2, {"loss": 0.25, "kl": math.nan, "x": math.inf})  # not measured: left out
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["loss"]) for m in lines] == [(1, 0.5), (2, 0.25)]
    assert lines[0]["tokens"] == 12.0 and "kl" not in lines[1] and "x" not in lines[1] and "time" in lines[0]
    assert [(m.step, m.values) for m in store.query_metrics("r1")] == [
        (1, {"loss": 0.5, "tokens": 12.0}),
        (2, {"loss": 0.25}),
    ]
    for tracker in trackers:
        assert tracker.logged == [(1, {"loss": 0.5, "tokens": 12.0}), (2, {"loss": 0.25})] and tracker.closed == 1
    # A second run log appends (a resumed run continues the file).
    with RunLog(tmp_path / "run", store, "r1") as run_log:
        run_log.log(3, {"loss": 0.125})
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3


def test_closed_on_error_and_the_run_error_is_the_one_raised(tmp_path):
    failing, fine = ListTracker(fail_close=True), ListTracker()
    with pytest.raises(ValueError, match="the run failed"):
        with RunLog(tmp_path, MemoryStore(), "r", [failing, fine]) as run_log:
            run_log.log(1, {"a": 1.0})
            raise ValueError("the run failed")
    assert run_log._file is None and failing.closed == fine.closed == 1


def test_close_closes_every_tracker_then_raises_the_first_failure(tmp_path):
    failing, fine = ListTracker(fail_close=True), ListTracker()
    run_log = RunLog(tmp_path, MemoryStore(), "r", [failing, fine])
    with pytest.raises(RuntimeError, match="could not close"):
        run_log.close()
    assert fine.closed == 1
    run_log.close()  # twice is harmless
    assert failing.closed == fine.closed == 1


def test_without_an_output_dir_only_the_store_and_trackers(tmp_path):
    store = MemoryStore()
    with RunLog(None, store, "sft:x") as run_log:
        run_log.log(1, {"loss": 1.0})
    assert run_log.path is None and [m.values for m in store.query_metrics("sft:x")] == [{"loss": 1.0}]
