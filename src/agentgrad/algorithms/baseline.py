"""Evaluate: run every task once and summarize — the algorithm behind ``Trainer.dev()``.

It is the first thing to run on a new agent: does it finish, does it get rewards, does the store
see its LLM calls? The summary answers exactly those questions.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from agentgrad import semconv
from agentgrad.adapters.calls import extract_calls
from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.algorithms.batch import run_batch
from agentgrad.store.protocol import RolloutRequest, Store
from agentgrad.types import LLM, MetricRecord, Rollout, RolloutConfig, RolloutMode, RolloutStatus

#: The temperature of a request that names none: the OpenAI API's default, and the local model server's.
DEFAULT_TEMPERATURE = 1.0


@dataclass
class EvaluationReport:
    """Outcome of running a batch of tasks once."""

    rollouts: list[Rollout]
    spans_per_rollout: list[int]
    llm_calls_per_rollout: list[int]
    failure_reasons: collections.Counter = field(default_factory=collections.Counter)
    timed_out: int = 0
    #: The temperature the agent's LLM resource asked for (None: it named none, nothing checked)…
    temperature: float | None = None
    #: …and how many LLM calls' requests asked for another (or for none: the server's default).
    calls_at_other_temperature: int = 0

    @property
    def total(self) -> int:
        return len(self.rollouts)

    @property
    def succeeded(self) -> int:
        return sum(r.status == RolloutStatus.SUCCEEDED for r in self.rollouts)

    @property
    def failed(self) -> int:
        return self.total - self.succeeded

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts if r.reward is not None]

    @property
    def reward_mean(self) -> float | None:
        return statistics.fmean(self.rewards) if self.rewards else None

    @property
    def score(self) -> float:
        """Mean reward over every task, a failed or unrewarded rollout counting 0: the number a
        validation or a test reports (``reward_mean`` leaves such rollouts out)."""
        return statistics.fmean([r.reward or 0.0 for r in self.rollouts]) if self.rollouts else 0.0

    @property
    def no_llm_calls(self) -> int:
        return sum(n == 0 for n in self.llm_calls_per_rollout)

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "timed_out": self.timed_out,
            "reward_mean": self.reward_mean,
            "spans_per_rollout": _mean(self.spans_per_rollout),
            "llm_calls_per_rollout": _mean(self.llm_calls_per_rollout),
            "rollouts_without_llm_calls": self.no_llm_calls,
            "llm_calls_at_other_temperature": self.calls_at_other_temperature,
            "failure_reasons": dict(self.failure_reasons),
        }

    def temperature_warning(self) -> str | None:
        """What to tell the user when LLM calls did not ask for the resource's temperature: an
        agent that does not pass ``llm.sampling`` on to its client samples at its server's default,
        so a "greedy" validation or evaluation is not greedy (None when every call asked for it)."""
        if not self.calls_at_other_temperature or self.temperature is None:
            return None
        calls = sum(self.llm_calls_per_rollout)
        return (
            f"{self.calls_at_other_temperature} of {calls} LLM call(s) did not ask for the temperature of "
            f"the agent's LLM resource ({self.temperature:g}): pass the resource's sampling settings to the "
            'client (e.g. temperature=llm.sampling.get("temperature")), or these calls sample at the '
            f"server's default ({DEFAULT_TEMPERATURE:g}) whatever the run asks"
        )

    def print(self, console: Console | None = None) -> None:
        console = console or Console()
        table = Table(title="AgentGrad dev run", show_header=False)
        for key, value in self.as_dict().items():
            if key in ("failure_reasons", "llm_calls_at_other_temperature"):
                continue
            table.add_row(
                key.replace("_", " "),
                "—" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value),
            )
        console.print(table)
        if self.failure_reasons:
            reasons = Table(title="failure reasons", show_header=True)
            reasons.add_column("count", justify="right")
            reasons.add_column("reason")
            for reason, count in self.failure_reasons.most_common(10):
                reasons.add_row(str(count), reason)
            console.print(reasons)
        if self.no_llm_calls:
            console.print(
                f"[yellow]warning:[/] {self.no_llm_calls} rollout(s) captured no LLM call — they give no training data"
            )
        if warning := self.temperature_warning():
            console.print(f"[yellow]warning:[/] {warning}")


def _mean(values: Sequence[int]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    store: Store, rollouts: Sequence[Rollout], timed_out: int = 0, *, temperature: float | None = None
) -> EvaluationReport:
    """Read back spans and attempts of finished rollouts into a report. With ``temperature`` (what
    the agent's LLM resource asks for), count the LLM calls whose requests asked for another."""
    spans: list[int] = []  # span count per rollout
    calls: list[int] = []  # LLM-call count per rollout
    other_temperature = 0
    reasons: collections.Counter[str] = collections.Counter()
    for rollout in rollouts:
        latest = store.query_spans(rollout.rollout_id, "latest")
        spans.append(len(latest))
        calls.append(sum(s.name == semconv.SPAN_LLM_CALL for s in latest))
        if temperature is not None:
            other_temperature += sum(_asked_temperature(call.request) != temperature for call in extract_calls(latest))
        if rollout.status != RolloutStatus.SUCCEEDED:
            attempt = store.get_latest_attempt(rollout.rollout_id)
            error = attempt.error if attempt else None
            reasons[f"{error.type}: {error.message}"[:200] if error else rollout.status.value] += 1
    return EvaluationReport(list(rollouts), spans, calls, reasons, timed_out, temperature, other_temperature)


def _asked_temperature(request: dict[str, Any]) -> float | None:
    """The temperature an LLM request asked for (chat completions and Responses name it alike);
    none named is the server's default. None: not a number."""
    value = request.get("temperature")
    return DEFAULT_TEMPERATURE if value is None else _temperature(value)


def _temperature(value: Any) -> float | None:
    """``value`` as a temperature: a number (not a bool), else None."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def resource_temperature(store: Store, resources_id: str | None) -> float | None:
    """The temperature the LLM resources of ``resources_id`` (else the latest) ask for, when they
    agree on one; None when there is no LLM resource, one names none, or they differ."""
    resources = store.get_resources(resources_id) if resources_id else store.get_latest_resources()
    llms = [item for item in (resources.items.values() if resources else ()) if isinstance(item, LLM)]
    asked = {item.sampling.get("temperature") for item in llms}
    return _temperature(asked.pop()) if len(asked) == 1 else None


class Evaluate(Algorithm):
    """Run each task once (in ``mode``) and report; with ``timeout`` unfinished ones are cancelled.

    With ``run_id`` the evaluation is a run of its own, comparable with training runs: its rollouts
    carry ``eval_run`` in their metadata and its scores are logged as metrics under
    ``eval:<run_id>`` (``eval/reward_mean``, ``eval/succeeded``), so the dashboard lists it.
    """

    def __init__(
        self,
        *,
        mode: RolloutMode = "train",
        timeout: float | None = None,
        config: RolloutConfig | None = None,
        resources_id: str | None = None,
        run_id: str | None = None,
    ) -> None:
        self.mode, self.timeout, self.config, self.resources_id = mode, timeout, config, resources_id
        self.run_id = run_id

    def run(self, context: AlgorithmContext) -> EvaluationReport:
        store = context.store
        tasks = list(context.val_tasks if self.mode != "train" and context.val_tasks else context.train_tasks)
        if not tasks:
            raise ValueError("nothing to evaluate: no tasks were given")
        metadata = {"eval_run": self.run_id} if self.run_id else {}
        requests = [
            RolloutRequest(
                input=task,
                mode=self.mode,
                config=self.config or RolloutConfig(),
                resources_id=self.resources_id,
                metadata=metadata,
            )
            for task in tasks
        ]
        # A report is due at ``timeout``: stragglers are cancelled and reported as ``timed_out``.
        with context.console.status(f"running {len(requests)} rollout(s)…"):
            batch = run_batch(
                store, requests, timeout=self.timeout, on_straggler="cancel", label=f"evaluation ({self.mode})"
            )
        report = summarize(
            store, batch.rollouts, batch.cancelled, temperature=resource_temperature(store, self.resources_id)
        )
        if self.run_id:
            values = {"eval/succeeded": report.succeeded / report.total, "eval/rollouts": float(report.total)}
            if report.reward_mean is not None:
                values["eval/reward_mean"] = report.reward_mean
            store.add_metrics([MetricRecord(run_id=f"eval:{self.run_id}", step=0, values=values)])
        return report
