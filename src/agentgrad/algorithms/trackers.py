"""Experiment trackers: a run's metrics in TensorBoard, Weights & Biases or MLflow.

Each tracker is a :class:`~agentgrad.algorithms.runlog.Tracker` (``log(step, values)``,
``close()``) that a :class:`~agentgrad.algorithms.runlog.RunLog` feeds besides the store and
``metrics.jsonl``, which stay the default and need nothing. The trackers' packages are the
optional extra ``trackers`` (``pip install 'agentgrad[trackers]'``) and are imported only when a
tracker is made; without them, making one raises :class:`TrackerNotInstalledError`, naming the
package and the extra.

=============== ============================ ==================================================
name            class                        what it writes (under the run's output directory)
=============== ============================ ==================================================
``tensorboard`` :class:`TensorBoardTracker`  event files in ``tensorboard/`` (``tensorboardX``)
``wandb``       :class:`WandbTracker`        an offline W&B run in ``wandb/offline-run-*``
``mlflow``      :class:`MLflowTracker`       an MLflow run in the SQLite store ``mlflow.db``
=============== ============================ ==================================================

Values are floats. A value that is not a finite number (NaN, ±inf, ``None``, text) is skipped,
with one warning per key and tracker: NaN means "not measured" in a step's metrics, and none of
the three tools shows a gap well.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlparse

from agentgrad.errors import AgentGradError, InvalidInputError

if TYPE_CHECKING:
    from agentgrad.algorithms.runlog import Tracker

log = logging.getLogger(__name__)

#: The optional extra that installs every tracker's package.
EXTRA = "trackers"
INSTALL = f"pip install 'agentgrad[{EXTRA}]'"

#: The names :func:`make_trackers` knows.
TRACKER_NAMES = ("tensorboard", "wandb", "mlflow")


class TrackerNotInstalledError(AgentGradError, ImportError):
    """A tracker's package is not installed; the message names it and the extra to install."""


def _require(module: str, tracker: str, package: str | None = None) -> ModuleType:
    """``import module``, or :class:`TrackerNotInstalledError` naming the package and the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TrackerNotInstalledError(
            f"the {tracker} tracker needs the {package or module!r} package, which is not installed ({exc}): {INSTALL}"
        ) from exc


def _metric_number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a number or not finite."""
    if isinstance(value, (str, bytes)):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


class _Tracker:
    """What every tracker shares: the value check, closing once, the context manager."""

    #: The tracker's name in messages (and in :func:`make_trackers`).
    name = "tracker"

    def __init__(self) -> None:
        self._warned: set[str] = set()
        self._closed = False

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Write the finite ``values`` of ``step``; a step with none writes nothing."""
        if self._closed:
            raise RuntimeError(f"the {self.name} tracker is closed")
        finite: dict[str, float] = {}
        for key, value in values.items():
            number = _metric_number(value)
            if number is None:
                self._warn_once(str(key), f"{value!r} is not a finite number: skipped (and later ones of this key)")
            else:
                finite[str(key)] = number
        if finite:
            self._write(int(step), finite)

    def close(self) -> None:
        """Finish the run and flush it to disk. Closing twice is harmless."""
        self._close(failed=False)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(failed=exc is not None)

    def _close(self, *, failed: bool) -> None:
        if not self._closed:
            self._closed = True
            self._finish(failed=failed)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s tracker: metric %r: %s", self.name, key, message)

    def _write(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def _finish(self, *, failed: bool) -> None:
        raise NotImplementedError


class TensorBoardTracker(_Tracker):
    """Scalars in TensorBoard event files under ``log_dir`` (``tensorboard --logdir LOG_DIR``).

    Written with ``tensorboardX``, which needs neither TensorFlow nor torch. A key's ``/`` groups
    it in TensorBoard (``val/success`` sits under ``val``). Each step is flushed to disk, so a
    running TensorBoard sees it at once; a resumed run adds a new event file to the same folder.
    """

    name = "tensorboard"

    def __init__(self, log_dir: str | Path) -> None:
        super().__init__()
        tensorboardx = _require("tensorboardX", "TensorBoard")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = tensorboardx.SummaryWriter(logdir=str(self.log_dir))

    def _write(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def _finish(self, *, failed: bool) -> None:
        self._writer.close()


class WandbTracker(_Tracker):
    """A Weights & Biases run; offline by default, so it needs no account and no network.

    An offline run is written to ``dir/wandb/offline-run-<time>-<id>/`` (``run_dir``); upload it
    later with ``wandb sync RUN_DIR``. ``mode="online"`` logs live (after ``wandb login``).
    ``settings`` are :class:`wandb.Settings` fields, over these defaults: ``console="off"`` (W&B
    does not capture the terminal, where the run's live progress is drawn) and ``silent=True``.
    Each tracker is a run of its own (W&B's ``reinit="create_new"``), so two at once do not
    finish each other; steps must grow, as W&B drops a step lower than one already logged.
    """

    name = "wandb"

    def __init__(
        self,
        project: str,
        run_name: str | None = None,
        *,
        mode: str = "offline",
        dir: str | Path | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        wandb = _require("wandb", "Weights & Biases")
        self.dir = Path(dir) if dir is not None else Path.cwd()
        self.dir.mkdir(parents=True, exist_ok=True)
        options = {"console": "off", "silent": True, **(settings or {})}
        self._run = wandb.init(
            project=project,
            name=run_name,
            mode=mode,
            dir=str(self.dir),
            settings=wandb.Settings(**options),
            reinit="create_new",
        )
        #: The run's own folder (``offline-run-*`` offline, ``run-*`` online).
        self.run_dir = Path(self._run.settings.sync_dir)
        if mode == "offline":
            log.info(
                "W&B offline run %s in %s (upload it with `wandb sync %s`)", self._run.id, self.run_dir, self.run_dir
            )

    def _write(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def _finish(self, *, failed: bool) -> None:
        self._run.finish(exit_code=1 if failed else 0)
        # finish() returns before wandb-core has written the run's last records (it closes the
        # run's files a moment later, or at exit: an offline run read at once was found empty).
        # When no other W&B run is open in this process, wandb.teardown() waits for that, so a
        # closed tracker's run is complete on disk; a later wandb.init() starts W&B again.
        wandb = _require("wandb", "Weights & Biases")
        try:
            still_open = wandb.setup().most_recent_active_run is not None
        except AttributeError:  # a W&B without it: leave the files to W&B's exit hook
            still_open = True
        if not still_open:
            wandb.teardown()


#: Characters MLflow refuses in a metric name (it takes letters, digits, ``_ - . /``, spaces, and
#: ``:`` except on Windows; ``:`` is replaced too, so that a run's keys are the same everywhere).
_MLFLOW_KEY_DISALLOWED = re.compile(r"[^\w\-. /]")


def _mlflow_key(key: str) -> str:
    """``key`` as a metric name MLflow takes: refused characters become ``_``, and the name read as
    a path is already normal (no empty, ``.`` or ``..`` part, no leading ``/``)."""
    parts = _MLFLOW_KEY_DISALLOWED.sub("_", key).split("/")
    return "/".join("__" if part == ".." else part for part in parts if part not in ("", ".")) or "_"


class MLflowTracker(_Tracker):
    """An MLflow run in ``experiment`` (created when missing) of the store at ``tracking_uri``.

    Any tracking URI works: ``sqlite:///PATH/mlflow.db`` (what :func:`make_trackers` uses: the
    store MLflow recommends; ``mlflow ui --backend-store-uri sqlite:///PATH/mlflow.db`` shows it),
    ``file:PATH`` (the file store, which MLflow 3 keeps only in maintenance mode and refuses
    unless ``MLFLOW_ALLOW_FILE_STORE`` is set: this tracker sets it for a ``file:`` URI, as asking
    for one is the opt-in) or an ``http(s)://`` tracking server. A key with characters MLflow
    refuses is logged with them replaced by ``_`` (one warning per key).
    """

    name = "mlflow"

    def __init__(self, tracking_uri: str, experiment: str, run_name: str | None = None) -> None:
        super().__init__()
        _require("mlflow", "MLflow", "mlflow-skinny")
        if tracking_uri.startswith("sqlite:"):
            _require("sqlalchemy", "MLflow (its SQLite store)")
            _require("alembic", "MLflow (its SQLite store)")
        elif urlparse(tracking_uri).scheme in ("", "file"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        self.tracking_uri, self.experiment = tracking_uri, experiment
        self._client = MlflowClient(tracking_uri=tracking_uri)
        found = self._client.get_experiment_by_name(experiment)
        if found is None:
            try:
                experiment_id = self._client.create_experiment(experiment)
            except MlflowException:  # another process created it first
                found = self._client.get_experiment_by_name(experiment)
                if found is None:
                    raise
                experiment_id = found.experiment_id
        elif found.lifecycle_stage != "active":
            raise InvalidInputError(
                f"the MLflow experiment {experiment!r} at {tracking_uri} is deleted: "
                "restore it (mlflow experiments restore) or name another one"
            )
        else:
            experiment_id = found.experiment_id
        #: The MLflow run's id (``MlflowClient(tracking_uri).get_metric_history(run_id, key)``).
        self.run_id: str = self._client.create_run(experiment_id, run_name=run_name).info.run_id
        self._keys: dict[str, str] = {}

    def _key(self, key: str) -> str:
        if key not in self._keys:
            safe = _mlflow_key(key)
            if safe != key:
                self._warn_once(key, f"logged as {safe!r} (MLflow refuses some characters)")
            self._keys[key] = safe
        return self._keys[key]

    def _write(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(self._key(key), value, now, step) for key, value in values.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def _finish(self, *, failed: bool) -> None:
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def make_trackers(names: Sequence[str], output_dir: Path, run_id: str) -> list[Tracker]:
    """The trackers ``names`` asks for, each writing under ``output_dir`` and named ``run_id``.

    ``names`` are among :data:`TRACKER_NAMES` (case and blanks ignored; a single string may hold
    several, comma-separated; a repeated name counts once; an empty list makes none):

    * ``tensorboard``: :class:`TensorBoardTracker` into ``output_dir/tensorboard``;
    * ``wandb``: :class:`WandbTracker` into ``output_dir/wandb``, project ``$WANDB_PROJECT`` or
      ``agentgrad``, mode ``$WANDB_MODE`` or ``offline``;
    * ``mlflow``: :class:`MLflowTracker` at ``$MLFLOW_TRACKING_URI`` or the SQLite store
      ``output_dir/mlflow.db``, experiment ``$MLFLOW_EXPERIMENT_NAME`` or ``agentgrad``.

    An unknown name raises :class:`~agentgrad.errors.InvalidInputError` before any tracker is
    made; when one fails to start, those already made are closed before the error is raised.
    """
    if isinstance(names, str):
        names = names.split(",")
    wanted: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        if name and name not in wanted:
            wanted.append(name)
    unknown = [name for name in wanted if name not in TRACKER_NAMES]
    if unknown:
        raise InvalidInputError(
            f"unknown tracker(s) {', '.join(map(repr, unknown))}: choose among {', '.join(TRACKER_NAMES)}"
        )
    output_dir = Path(output_dir)
    made: list[Tracker] = []
    try:
        for name in wanted:
            if name == "tensorboard":
                made.append(TensorBoardTracker(output_dir / "tensorboard"))
            elif name == "wandb":
                made.append(
                    WandbTracker(
                        os.environ.get("WANDB_PROJECT") or "agentgrad",
                        run_id,
                        mode=os.environ.get("WANDB_MODE") or "offline",
                        dir=output_dir,
                    )
                )
            else:
                output_dir.mkdir(parents=True, exist_ok=True)
                uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"
                made.append(MLflowTracker(uri, os.environ.get("MLFLOW_EXPERIMENT_NAME") or "agentgrad", run_id))
    except BaseException:
        for tracker in made:
            try:
                tracker.close()
            except Exception:  # the error that stopped us is the one to raise
                log.exception("closing the %s tracker", getattr(tracker, "name", "?"))
        raise
    return made
