"""Runs as the dashboard sees them: built from what algorithms already write to any store.

A run is a ``run_id`` of the metric records (:class:`~agentgrad.algorithms.runlog.RunLog`);
its rollouts are recognised by the metadata each algorithm puts on them (GRPO's group ids,
APO's ``apo_run``, SFT's ``sft_run``, an evaluation's ``eval_run``), so no store query beyond
the Store protocol is needed. Rollouts no algorithm tagged (``Trainer.dev`` without a run id)
belong to no run. Every read here
is bounded: the runs page answers as fast over 10,000 rollouts as over ten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from agentgrad.errors import NotFoundError
from agentgrad.rewards import reward_number
from agentgrad.store.protocol import RolloutFilter, Store
from agentgrad.types import LLM, MetricRecord, Rollout

#: GRPO's group ids: ``<run_id>-s<step>-t<task>-r<retry>`` (``GRPO.submit``).
_GRPO_GROUP = re.compile(r"^(?P<run>.+)-s(?P<step>\d+)-t\d+-r\d+$")
#: APO's rollout groups: ``apo:<run>:val:<snapshot>`` and ``apo:<run>:r<round>:critique:<snapshot>``.
_APO_ROUND = re.compile(r"^apo:.+?:r(?P<round>\d+):critique:")

#: The charts shown by default, in this order: the handful that say whether training works.
#: Each entry is one concept and the metric names algorithms log it under (exact names, so
#: ``adapter/rollouts_without_reward`` is not mistaken for a reward).
KEY_METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/mean", "reward", "reward_mean")),
    ("validation", ("val/reward_mean", "val/success", "val_score", "best_score", "eval/reward_mean")),
    ("success", ("success", "success_rate")),
    ("loss", ("loss",)),
    ("entropy", ("entropy",)),
    ("KL", ("kl",)),
    ("tokens/s", ("tokens_per_second", "throughput/tokens_per_s")),
)
_KEY_ORDER = {name: rank for rank, (_, names) in enumerate(KEY_METRICS) for name in names}
#: Metrics that score validation, best first: what the runs table calls "validation".
VALIDATION_METRICS = ("val/reward_mean", "val/success", "val_score", "best_score", "eval/reward_mean")


def metric_order(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the key metrics among ``names`` in :data:`KEY_METRICS` order, the rest alphabetically)."""
    names = set(names)
    key = sorted((n for n in names if n in _KEY_ORDER), key=lambda n: (_KEY_ORDER[n], n))
    rest = sorted((n for n in names if n not in _KEY_ORDER), key=str.lower)
    return key, rest


def algorithm_of(run_id: str, metric_names: Iterable[str]) -> str:
    """Which algorithm wrote a run, from its id (``apo:``, ``sft:``, ``eval:``) or its metrics."""
    if run_id.startswith("apo:"):
        return "APO"
    if run_id.startswith("sft:"):
        return "SFT"
    if run_id.startswith("eval:"):
        return "evaluation"
    names = set(metric_names)
    if any(n.startswith("grpo/") for n in names) or {"entropy", "kl"} <= names:
        return "GRPO"
    return "—"


def run_of(rollout: Rollout) -> str | None:
    """The run (metric ``run_id``) a rollout belongs to, from the metadata its algorithm set."""
    meta = rollout.metadata
    if isinstance(meta.get("validation_of"), str):  # a training run's greedy validation
        return meta["validation_of"]
    if isinstance(meta.get("apo_run"), str):
        return f"apo:{meta['apo_run']}"
    if isinstance(meta.get("sft_run"), str):
        return f"sft:{meta['sft_run']}"
    if isinstance(meta.get("eval_run"), str):
        return f"eval:{meta['eval_run']}"
    group = meta.get("group_id")
    if isinstance(group, str) and (match := _GRPO_GROUP.match(group)):
        return match["run"]
    return None


def step_of(rollout: Rollout) -> int | None:
    """The training step (GRPO), iteration (SFT) or round (APO critique) a rollout ran in."""
    meta = rollout.metadata
    for key in ("step", "sft_iteration"):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    group = meta.get("group_id")
    if isinstance(group, str) and (match := _GRPO_GROUP.match(group) or _APO_ROUND.match(group)):
        return int(match.groupdict().get("step") or match.groupdict().get("round") or 0)
    return None


def task_summary(value: Any, limit: int = 90) -> str:
    """A task input in one short line: its question/prompt/text field, else its first string."""
    if isinstance(value, dict):
        for key in ("question", "prompt", "task", "query", "input", "text", "instruction"):
            if isinstance(value.get(key), str):
                value = value[key]
                break
        else:
            value = next((v for v in value.values() if isinstance(v, str)), value)
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class RunSummary:
    """One row of the runs table."""

    run_id: str
    algorithm: str
    model: str | None
    start: float
    steps: int
    last_step: int
    best_validation: float | None
    last_validation: float | None
    validation_metric: str | None


#: Rollouts read (newest first) to find each run's model: a bounded read, whatever the store holds.
MODEL_SCAN = 1000


def _model(store: Store, resources_id: str | None, cache: dict[str, str | None]) -> str | None:
    """The model of the first LLM item of a snapshot (cached per snapshot id)."""
    if resources_id is None:
        return None
    if resources_id not in cache:
        try:
            items = store.get_resources(resources_id).items
        except NotFoundError:  # a rollout may name a snapshot that was never published
            items = {}
        cache[resources_id] = next((i.model for i in items.values() if isinstance(i, LLM)), None)
    return cache[resources_id]


def _models(store: Store, by_run: dict[str, list[MetricRecord]]) -> dict[str, str | None]:
    """Each run's model, from the resources of one of its rollouts: the newest MODEL_SCAN
    rollouts, then, for a GRPO run not among them, the first group of one of its logged steps
    (an exact group-id query)."""
    cache: dict[str, str | None] = {}
    found: dict[str, str | None] = {}
    for rollout in store.query_rollouts(RolloutFilter(sort_by="enqueue_time", descending=True, limit=MODEL_SCAN)):
        run = run_of(rollout)
        if run is not None and found.get(run) is None:
            found[run] = _model(store, rollout.resources_id, cache)
    for run, records in by_run.items():
        if found.get(run) is None and not run.startswith(("apo:", "sft:", "eval:")):
            for step in sorted({r.step for r in records if r.step > 0})[:3]:
                probe = store.query_rollouts(RolloutFilter(group_id=f"{run}-s{step}-t0-r0", limit=1))
                if probe and (model := _model(store, probe[0].resources_id, cache)):
                    found[run] = model
                    break
        if found.get(run) is None and run.endswith(":candidates"):
            found[run] = found.get(run.removesuffix(":candidates"))
    return found


def summarize_runs(store: Store, records: list[MetricRecord]) -> list[RunSummary]:
    """Every run of ``records``, newest first, with its model (see :func:`_models`)."""
    by_run: dict[str, list[MetricRecord]] = {}
    for record in records:
        by_run.setdefault(record.run_id, []).append(record)
    models = _models(store, by_run)
    runs = []
    for run_id, run_records in by_run.items():
        names = {n for r in run_records for n in r.values}
        metric = next((m for m in VALIDATION_METRICS if m in names), None)
        curve = [
            v
            for r in sorted(run_records, key=lambda r: (r.step, r.time))
            if metric and (v := reward_number(r.values.get(metric))) is not None
        ]
        runs.append(
            RunSummary(
                run_id,
                algorithm_of(run_id, names),
                models.get(run_id),
                min(r.time for r in run_records),
                len({r.step for r in run_records}),
                max(r.step for r in run_records),
                max(curve) if curve else None,
                curve[-1] if curve else None,
                metric,
            )
        )
    return sorted(runs, key=lambda r: r.start, reverse=True)


def curves(records: list[MetricRecord], runs: list[str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """metric name → run → (step, value) pairs in step order (the last record of a step wins)."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for record in sorted(records, key=lambda r: r.time):
        if record.run_id not in runs:
            continue
        for name, value in record.values.items():  # finite floats: the store refuses any other
            out.setdefault(name, {run: {} for run in runs})[record.run_id][record.step] = value
    return {name: {run: sorted(by_step.items()) for run, by_step in per_run.items()} for name, per_run in out.items()}
