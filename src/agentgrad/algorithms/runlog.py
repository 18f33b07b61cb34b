"""Where a run's metrics go: ``metrics.jsonl``, the store (for the dashboard) and any trackers.

Every algorithm logs a step's numbers once, through a :class:`RunLog`; the run log writes them
to each sink. The store and the JSONL file are always on; experiment trackers (TensorBoard,
Weights & Biases, MLflow: :mod:`agentgrad.algorithms.trackers`) are optional :class:`Tracker`\\ s
handed in by the caller. A run log is a context manager: the file and the trackers are closed
when the run ends, however it ends.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Protocol, runtime_checkable

from agentgrad.store.protocol import Store
from agentgrad.types import MetricRecord

log = logging.getLogger(__name__)


@runtime_checkable
class Tracker(Protocol):
    """An experiment tracker: receives every logged step, closed once at the end of the run."""

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def read_back(output_dir: Path, up_to_step: int) -> list[dict[str, float]]:
    """The records a run logged to ``output_dir/metrics.jsonl`` for steps up to ``up_to_step`` (the
    step a resumed run goes on from), oldest first, without their ``time``. A line a crash cut
    short is skipped, and so are records of later steps: the resumed run logs those again."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= up_to_step:
            record.pop("time", None)
            records.append(record)
    return records


class RunLog:
    """Logs a run's metrics to ``output_dir/metrics.jsonl`` (appended: a resumed run continues
    it), to ``store.add_metrics`` under ``run_id``, and to each tracker.

    ``output_dir=None`` writes no file (an algorithm without an output directory). Values that
    are not finite (NaN marks "not measured") are left out: JSON and the store have no NaN.
    """

    def __init__(self, output_dir: Path | None, store: Store, run_id: str, trackers: Sequence[Tracker] = ()) -> None:
        self.store, self.run_id = store, run_id
        self.trackers = list(trackers)
        self.path = Path(output_dir) / "metrics.jsonl" if output_dir is not None else None
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Record ``values`` for ``step`` in every sink."""
        clean = {key: float(value) for key, value in values.items() if math.isfinite(float(value))}
        if self._file is not None:
            self._file.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
            self._file.flush()
        self.store.add_metrics([MetricRecord(run_id=self.run_id, step=step, values=clean)])
        for tracker in self.trackers:
            tracker.log(step, clean)

    def close(self) -> None:
        """Close the file and every tracker (all of them, even when one fails; the first error is
        raised after). Closing twice is harmless."""
        error: BaseException | None = None
        if self._file is not None:
            self._file.close()
            self._file = None
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001 - close the others, then report the first
                error = error or exc
        if error is not None:
            raise error

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
            return
        try:  # the run's own error is the one to see; a tracker failing to close is logged
            self.close()
        except Exception:  # noqa: BLE001 - any close failure is logged, not raised
            log.exception("closing the run log of %s after an error", self.run_id)
