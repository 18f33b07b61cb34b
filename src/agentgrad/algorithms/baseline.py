"""Evaluate: run every task once and summarize — the algorithm behind ``Trainer.dev()``.

It is the first thing to run on a new agent: does it finish, does it get rewards, does the store
see its LLM calls? The summary answers exactly those questions.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from agentgrad.adapters.calls import CUT_AT_TOKEN_LIMIT, LLMCall, content_text, extract_calls
from agentgrad.algorithms.base import Algorithm, AlgorithmContext, run_console
from agentgrad.algorithms.batch import run_batch
from agentgrad.store.protocol import RolloutRequest, Store
from agentgrad.types import LLM, MetricRecord, Rollout, RolloutConfig, RolloutMode, RolloutStatus

#: The temperature of a request that names none: the OpenAI API's default, and the local model server's.
DEFAULT_TEMPERATURE = 1.0


@dataclass
class RolloutExample:
    """One rollout's last LLM call, as the summary shows it: what the model was asked last and
    what it answered — the first thing to read when rewards are low."""

    rollout_id: str
    reward: float | None
    llm_calls: int
    agent_name: str | None = None
    #: The last message of the last call's request, as ``(role, text)``.
    asked: tuple[str, str] | None = None
    reply: str = ""
    tool_calls: list[str] = field(default_factory=list)
    finish_reason: str | None = None

    @classmethod
    def of(cls, rollout: Rollout, calls: Sequence[LLMCall]) -> RolloutExample:
        if not calls:
            return cls(rollout.rollout_id, rollout.reward, 0)
        last = calls[-1]
        messages = last.request_messages
        asked = None
        if messages and isinstance(messages[-1], dict):
            content = messages[-1].get("content")
            text = content_text(content)
            asked = (str(messages[-1].get("role", "?")), str(content) if text is None else text)
        tools = [
            f"{function.get('name', '?')}({function.get('arguments', '')})"
            for call in last.tool_calls
            if isinstance(function := call.get("function"), dict)
        ]
        return cls(
            rollout.rollout_id,
            rollout.reward,
            len(calls),
            last.agent_name,
            asked,
            last.assistant_text,
            tools,
            last.finish_reason,
        )

    def lines(self, width: int = 300) -> list[str]:
        """The example as plain lines, each text cut to ``width`` characters."""
        reward = "none" if self.reward is None else f"{self.reward:.3g}"
        lines = [f"lowest reward ({reward}): {self.rollout_id}, {self.llm_calls} LLM call(s)"]
        if not self.llm_calls:
            return lines
        agent = f" (agent {self.agent_name})" if self.agent_name else ""
        lines.append(f"  its last call{agent}:")
        if self.asked:
            lines.append(f"    {self.asked[0]}: {_one_line(self.asked[1], width)}")
        reply = _one_line(self.reply, width) or "(no text)"
        lines.append(f"    reply: {reply}")
        lines.extend(f"    tool call: {_one_line(call, width)}" for call in self.tool_calls)
        if self.finish_reason == CUT_AT_TOKEN_LIMIT:
            lines.append("    (cut at the token limit: max_tokens)")
        return lines


def _one_line(text: str, width: int) -> str:
    text = " ⏎ ".join(line.strip() for line in text.strip().splitlines())
    return text if len(text) <= width else text[: width - 1] + "…"


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
    #: LLM calls whose reply the server cut at the request's token limit (finish reason "length").
    calls_cut_at_token_limit: int = 0
    #: The lowest-rewarded rollout's last LLM call (None: no rollout had a reward).
    lowest: RolloutExample | None = None
    #: The evaluation run's id when it was recorded as one (``agentgrad eval``), else None (``dev``).
    run_id: str | None = None
    #: LLM calls per agent name (None: a call no agent name reached) — the names ``agent_match``
    #: selects from, so a multi-agent program's user sees them before training.
    calls_by_agent: collections.Counter[str | None] = field(default_factory=collections.Counter)

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
            "score": self.score,
            "spans_per_rollout": _mean(self.spans_per_rollout),
            "llm_calls_per_rollout": _mean(self.llm_calls_per_rollout),
            "rollouts_without_llm_calls": self.no_llm_calls,
            "llm_calls_at_other_temperature": self.calls_at_other_temperature,
            "llm_calls_cut_at_token_limit": self.calls_cut_at_token_limit,
            "llm_calls_by_agent": {name or "": count for name, count in self.calls_by_agent.most_common()},
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
        console = console or run_console()
        title = f"AgentGrad evaluation {self.run_id}" if self.run_id else "AgentGrad dev run"
        table = Table(title=title, show_header=False)
        for key, value in self.as_dict().items():
            if key in (
                "failure_reasons",
                "llm_calls_at_other_temperature",
                "llm_calls_cut_at_token_limit",
                "llm_calls_by_agent",
            ):
                continue
            table.add_row(
                "score (a failure counts 0)" if key == "score" else key.replace("_", " "),
                "—" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value),
            )
        console.print(table)
        if self.calls_by_agent:
            console.print(
                "LLM calls by agent: "
                + " · ".join(f"{name or '(no name)'} {count}" for name, count in self.calls_by_agent.most_common())
                + " (the names --agent-match / agent_match selects from)",
                markup=False,
                highlight=False,
            )
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
        if self.calls_cut_at_token_limit:
            calls = sum(self.llm_calls_per_rollout)
            console.print(
                f"[yellow]warning:[/] {self.calls_cut_at_token_limit} of {calls} LLM call(s) were cut at their "
                'token limit (finish reason "length"): their replies end mid-way — give them more max_tokens'
            )
        if self.lowest is not None:
            for line in self.lowest.lines():
                console.print(line, markup=False, highlight=False)


def _mean(values: Sequence[int]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    store: Store, rollouts: Sequence[Rollout], timed_out: int = 0, *, temperature: float | None = None
) -> EvaluationReport:
    """Read back spans and attempts of finished rollouts into a report. With ``temperature`` (what
    the agent's LLM resource asks for), count the LLM calls whose requests asked for another."""
    spans: list[int] = []  # span count per rollout
    calls: list[int] = []  # LLM-call count per rollout
    other_temperature = cut = 0
    lowest: RolloutExample | None = None
    lowest_reward = math.inf
    reasons: collections.Counter[str] = collections.Counter()
    by_agent: collections.Counter[str | None] = collections.Counter()
    for rollout in rollouts:
        latest = store.query_spans(rollout.rollout_id, "latest")
        spans.append(len(latest))
        read = extract_calls(latest)
        calls.append(len(read))
        by_agent.update(call.agent_name for call in read)
        cut += sum(call.finish_reason == CUT_AT_TOKEN_LIMIT for call in read)
        if temperature is not None:
            other_temperature += sum(_asked_temperature(call.request) != temperature for call in read)
        if rollout.reward is not None and rollout.reward < lowest_reward:
            lowest, lowest_reward = RolloutExample.of(rollout, read), rollout.reward
        if rollout.status != RolloutStatus.SUCCEEDED:
            attempt = store.get_latest_attempt(rollout.rollout_id)
            error = attempt.error if attempt else None
            reasons[f"{error.type}: {error.message}"[:200] if error else rollout.status.value] += 1
    return EvaluationReport(
        list(rollouts),
        spans,
        calls,
        reasons,
        timed_out,
        temperature,
        other_temperature,
        cut,
        lowest,
        calls_by_agent=by_agent,
    )


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
    ``metadata`` goes on every rollout too (a training run's validation names its run and step).
    """

    def __init__(
        self,
        *,
        mode: RolloutMode = "train",
        timeout: float | None = None,
        config: RolloutConfig | None = None,
        resources_id: str | None = None,
        run_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.mode, self.timeout, self.config, self.resources_id = mode, timeout, config, resources_id
        self.run_id, self.metadata = run_id, metadata or {}

    def run(self, context: AlgorithmContext) -> EvaluationReport:
        store = context.store
        tasks = list(context.val_tasks if self.mode != "train" and context.val_tasks else context.train_tasks)
        if not tasks:
            raise ValueError("nothing to evaluate: no tasks were given")
        metadata = {**self.metadata, **({"eval_run": self.run_id} if self.run_id else {})}
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
        report.run_id = self.run_id
        if self.run_id:
            values = {"eval/succeeded": report.succeeded / report.total, "eval/rollouts": float(report.total)}
            if report.reward_mean is not None:
                values["eval/reward_mean"] = report.reward_mean
            store.add_metrics([MetricRecord(run_id=f"eval:{self.run_id}", step=0, values=values)])
        return report
