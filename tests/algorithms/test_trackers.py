"""Experiment trackers: each writes a few steps, and what it wrote is read back from disk with the
tool's own reader (TensorBoard's EventAccumulator, W&B's record protobuf, MLflow's client)."""

from __future__ import annotations

import json
import logging
import math
import struct
import sys
from pathlib import Path

import pytest

from agentgrad.algorithms.runlog import Tracker
from agentgrad.algorithms.trackers import (
    MLflowTracker,
    TensorBoardTracker,
    TrackerNotInstalledError,
    WandbTracker,
    make_trackers,
)
from agentgrad.errors import InvalidInputError

#: What each test logs: two keys, one of which is NaN at step 1 and +inf at step 2 (skipped).
STEPS = [
    (0, {"reward/mean": 0.25, "loss": 1.5}),
    (1, {"reward/mean": 0.5, "loss": math.nan}),
    (2, {"reward/mean": 0.75, "loss": math.inf}),
    (3, {"reward/mean": 1.0, "loss": 0.5}),
]
WANT = {"reward/mean": [(0, 0.25), (1, 0.5), (2, 0.75), (3, 1.0)], "loss": [(0, 1.5), (3, 0.5)]}

# W&B offline runs of the tests stay in the test's folder, and nothing reaches the network.
WANDB_QUIET = {"x_disable_stats": True, "disable_git": True, "save_code": False}


def _log_steps(tracker: Tracker) -> None:
    for step, values in STEPS:
        tracker.log(step, values)
    tracker.close()


def _require(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (pip install 'agentgrad[trackers]')")


# ------------------------------------------------------------------ the tools' own readers


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars of the event files in ``log_dir``, read with TensorBoard's EventAccumulator."""
    _require("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (``run-<id>.wandb``), decoded with W&B's own ``Record``.

    The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then
    LevelDB-log framed records in 32 KiB blocks, each chunk ``crc32(4) length(2) type(1) data``
    (type 1 full, 2 first, 3 middle, 4 last). The wandb package reads it in Go only (wandb-core),
    so the framing is undone here and the payload parsed with W&B's protobuf.
    """
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), run_file
    block, header = 32768, 7
    records, pending, offset = [], b"", 7
    while offset + header <= len(data):
        left_in_block = block - offset % block
        if left_in_block < header:  # the block's tail is padding
            offset += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[offset : offset + header])
        if kind == 0 and length == 0:  # zero padding at the end
            break
        chunk = data[offset + header : offset + header + length]
        offset += header + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], list]:
    """Each key's (step, value) in the W&B run in ``run_dir``, and the run's records."""
    _require("wandb")
    (run_file,) = run_dir.glob("run-*.wandb")
    records = wandb_records(run_file)
    history: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for key, value in items.items():
            if not key.startswith("_"):  # W&B's own _step, _runtime, _timestamp
                history.setdefault(key, []).append((int(items["_step"]), value))
    return history, records


def mlflow_history(tracking_uri: str, run_id: str) -> tuple[dict[str, list[tuple[int, float]]], object]:
    """Each metric's (step, value) of an MLflow run, read with ``MlflowClient``, and the run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(run_id)
    history = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in run.data.metrics
    }
    return history, run


# ------------------------------------------------------------------ each tracker


def test_tensorboard_writes_event_files_tensorboard_reads(tmp_path: Path) -> None:
    _require("tensorboardX")
    tracker = TensorBoardTracker(tmp_path / "tb")
    assert isinstance(tracker, Tracker)
    _log_steps(tracker)
    tracker.close()  # twice is harmless
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert tensorboard_scalars(tmp_path / "tb") == WANT


def test_wandb_offline_run_is_read_back_from_its_run_file(tmp_path: Path) -> None:
    _require("wandb")
    tracker = WandbTracker("agentgrad-test", "run-a", dir=tmp_path, settings=WANDB_QUIET)
    assert isinstance(tracker, Tracker)
    assert tracker.run_dir.parent == tmp_path / "wandb" and tracker.run_dir.name.startswith("offline-run-")
    _log_steps(tracker)
    history, records = wandb_history(tracker.run_dir)
    assert history == WANT
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name) == ("agentgrad-test", "run-a")
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0


def test_mlflow_file_store_run_is_read_back_with_mlflow_client(tmp_path: Path) -> None:
    _require("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    tracker = MLflowTracker(uri, "agentgrad-test", "run-a")
    assert isinstance(tracker, Tracker)
    _log_steps(tracker)
    history, run = mlflow_history(uri, tracker.run_id)
    assert history == WANT
    assert (run.info.run_name, run.info.status) == ("run-a", "FINISHED")
    # A second run lands in the same experiment; a key MLflow refuses is renamed, not lost.
    with MLflowTracker(uri, "agentgrad-test", "run-b") as second:
        second.log(0, {"val:success@1": 0.5, "/a/./b/../c/": 1.0})
    history, run = mlflow_history(uri, second.run_id)
    assert history == {"val_success_1": [(0, 0.5)], "a/b/__/c": [(0, 1.0)]}
    assert run.info.experiment_id == mlflow_history(uri, tracker.run_id)[1].info.experiment_id


def test_a_run_that_fails_is_marked_failed(tmp_path: Path) -> None:
    _require("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    with pytest.raises(ZeroDivisionError), MLflowTracker(uri, "e", "boom") as tracker:
        tracker.log(0, {"x": 1.0})
        1 / 0  # noqa: B018
    assert mlflow_history(uri, tracker.run_id)[1].info.status == "FAILED"


# ------------------------------------------------------------------ what all share


def test_non_finite_values_are_skipped_with_one_warning_per_key(tmp_path: Path, caplog) -> None:
    _require("tensorboardX")
    tracker = TensorBoardTracker(tmp_path / "tb")
    with caplog.at_level(logging.WARNING, logger="agentgrad.algorithms.trackers"):
        for step in range(3):
            tracker.log(step, {"ok": 1.0, "nan": math.nan, "inf": -math.inf, "text": "0.5", "none": None})
    tracker.close()
    warned = sorted(r.getMessage().split("'")[1] for r in caplog.records)
    assert warned == ["inf", "nan", "none", "text"]
    assert tensorboard_scalars(tmp_path / "tb") == {"ok": [(0, 1.0), (1, 1.0), (2, 1.0)]}
    with pytest.raises(RuntimeError, match="closed"):
        tracker.log(3, {"ok": 1.0})


def test_make_trackers_puts_each_under_the_run_dir(tmp_path: Path, monkeypatch) -> None:
    for module in ("tensorboardX", "tensorboard", "wandb", "mlflow", "sqlalchemy", "alembic"):
        _require(module)
    for var in ("WANDB_PROJECT", "WANDB_MODE", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.setenv("WANDB__DISABLE_STATS", "true")
    trackers = make_trackers(["TensorBoard", " wandb", "mlflow", "wandb"], tmp_path / "out", "grpo-1")
    assert [t.name for t in trackers] == ["tensorboard", "wandb", "mlflow"]
    for tracker in trackers:
        _log_steps(tracker)
    _tb, wb, ml = trackers
    assert tensorboard_scalars(tmp_path / "out" / "tensorboard") == WANT
    assert wb.run_dir.parent == tmp_path / "out" / "wandb"
    assert wandb_history(wb.run_dir)[0] == WANT
    uri = f"sqlite:///{(tmp_path / 'out' / 'mlflow.db').resolve()}"
    assert ml.tracking_uri == uri
    history, run = mlflow_history(uri, ml.run_id)
    assert history == WANT
    assert run.info.run_name == "grpo-1"


def test_make_trackers_names() -> None:
    assert make_trackers([], Path("unused"), "r") == []
    assert make_trackers(" , ", Path("unused"), "r") == []
    with pytest.raises(InvalidInputError, match=r"'tensorbord'.*tensorboard, wandb, mlflow"):
        make_trackers(["tensorbord"], Path("unused"), "r")


@pytest.mark.parametrize(
    ("make", "module", "package"),
    [
        (lambda p: TensorBoardTracker(p), "tensorboardX", "tensorboardX"),
        (lambda p: WandbTracker("p", "r", dir=p), "wandb", "wandb"),
        (lambda p: MLflowTracker(p.as_uri(), "e"), "mlflow", "mlflow-skinny"),
        (lambda p: MLflowTracker(f"sqlite:///{p}/m.db", "e"), "sqlalchemy", "sqlalchemy"),
    ],
)
def test_a_missing_package_names_the_extra(tmp_path: Path, monkeypatch, make, module, package) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(TrackerNotInstalledError, match=rf"'{package}' package.*pip install 'agentgrad\[trackers\]'"):
        make(tmp_path)
    assert not list(tmp_path.iterdir())  # nothing was started or written
