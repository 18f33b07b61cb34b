"""APO: automatic prompt optimization by beam search with textual gradients.

Each round, for every prompt in the beam: run a batch of rollouts with it (the normal path:
store → runners → agent), let a *critic* LLM read their traces and rewards and write a critique
(the "textual gradient"), let an *editor* LLM rewrite the prompt following the critique
(``branch_factor`` proposals), score every new candidate on a validation batch (again through
the store and runners), and keep the best ``beam_width`` prompts seen so far.

Where everything lives (so a crashed run resumes from the store alone):

* **Candidates** are resources snapshots: the prompt under ``prompt_name`` (a versioned
  :class:`~agentgrad.types.PromptTemplate`, f-string or Jinja), the run's other items, and a JSON
  item ``apo`` holding the lineage — run id, round, parent candidate, the critique that led to it.
  Snapshot ids are ``apo-<run_id>-<hash of the prompt>``, so a prompt proposed twice is one
  candidate, and re-publishing after a crash is a no-op.
* **Critiques** are also stored on the metadata of the rollouts they were written from
  (``apo_critique``), together with the editor replies that were refused (``apo_rejected``), so a
  resumed run reuses them instead of asking the critic again.
* **Scores** are the validation rollouts themselves (``group_id`` ``apo:<run>:val:<candidate>``,
  score = mean reward, a failed rollout counting 0), recomputed on resume; they are mirrored as
  metrics (run ``apo:<run>:candidates``, step = snapshot version) and per-round summaries (run
  ``apo:<run>``, step = round) for dashboards.
* The winner is finally published as the latest snapshot (``…-best``), so agents started later
  without explicit resources pick it up.

The critic and editor are any OpenAI-compatible chat endpoint (:class:`ChatEndpoint`). Their
*content* is never trusted: a critique that is empty, or an edit without a ``<prompt>`` block,
that does not parse, reads a variable the agent does not supply, drops a required one or is too
long, is logged, recorded and skipped — never adopted. Transport failures that outlast the
retries stop the run (resumable), because silently optimizing against a dead endpoint would
return the seed prompt as if it had won.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agentgrad import semconv
from agentgrad.adapters.calls import extract_calls
from agentgrad.adapters.timeline import by_done
from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.algorithms.batch import StragglersError, wait_batch
from agentgrad.algorithms.runlog import RunLog
from agentgrad.algorithms.templates import TemplateError, validate_template
from agentgrad.errors import AgentGradError, AlreadyExistsError
from agentgrad.store.protocol import RolloutFilter, RolloutRequest, Store
from agentgrad.types import JsonResource, PromptTemplate, Rollout, RolloutConfig, RolloutMode, RolloutStatus

log = logging.getLogger(__name__)

#: Name of the JSON item holding a candidate's lineage in its resources snapshot.
APO_ITEM = "apo"

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_PROMPT_BLOCK = re.compile(r"<prompt>(.*?)</prompt>", re.DOTALL)

CRITIC_SYSTEM = (
    "You review the prompt template of an LLM agent. You are shown the template and several runs "
    "of the agent that used it: the task, a trace of what happened, and the reward (higher is "
    "better). Find what in the prompt causes the low rewards and say concisely which instructions "
    "would fix it. Do not rewrite the prompt yourself."
)
EDITOR_SYSTEM = (
    "You improve the prompt template of an LLM agent following a critique. Keep every template "
    "variable the prompt uses and add no new ones unless they are listed as available. Reply with "
    "the complete revised template inside <prompt></prompt> tags."
)


class APOError(AgentGradError):
    """APO cannot go on (no tasks, a critic/editor that cannot be reached, rollouts that never end)."""


@dataclass
class ChatEndpoint:
    """An OpenAI-compatible chat-completions endpoint used as critic or editor.

    ``concurrency`` bounds the calls in flight to this endpoint (hosted APIs rate-limit);
    ``retries`` re-sends on transport errors and 408/409/425/429/5xx with exponential backoff.
    """

    base_url: str
    model: str
    api_key: str | None = None
    temperature: float = 0.7
    max_tokens: int = 1024
    concurrency: int = 4
    retries: int = 3
    timeout: float = 120.0
    backoff_seconds: float = 1.0
    _slots: threading.BoundedSemaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be ≥ 1, got {self.concurrency}")
        if self.retries < 0:
            raise ValueError(f"retries must be ≥ 0, got {self.retries}")
        self._slots = threading.BoundedSemaphore(self.concurrency)

    def complete(self, messages: list[dict[str, str]]) -> str:
        """The first choice's text ("" when the reply has none); raises :class:`APOError` when the
        endpoint cannot be reached or refuses the request."""
        from agentgrad.http.transport import request_json  # lazy: only runs that call a critic need it

        url = self.base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        problem = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_seconds * 2 ** (attempt - 1))
            try:
                with self._slots:
                    response = request_json("POST", url, body, headers=headers, timeout=self.timeout)
            except OSError as exc:  # unreachable, reset, timed out
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if response.status in _RETRY_STATUS:
                problem = f"HTTP {response.status}: {response.text[:300]}"
                continue
            if response.status >= 400:
                raise APOError(
                    f"{url} (model {self.model!r}) refused the request: HTTP {response.status}: {response.text[:300]}"
                )
            try:
                choices = response.json().get("choices") or [{}]
                return str((choices[0].get("message") or {}).get("content") or "")
            except (ValueError, AttributeError) as exc:
                raise APOError(f"{url} did not answer with a chat completion: {exc}") from None
        raise APOError(f"{url} (model {self.model!r}) failed after {self.retries + 1} attempt(s): {problem}")


@dataclass
class Candidate:
    """One prompt APO has published: its snapshot, lineage and (once evaluated) score."""

    resources_id: str
    version: int
    template: PromptTemplate
    round: int
    parent: str | None = None
    critique: str | None = None
    score: float | None = None


@dataclass
class APOResult:
    """What ``Trainer.fit()`` returns for APO."""

    best: Candidate
    seed: Candidate
    candidates: list[Candidate]
    #: Per round: best score so far, beam mean, new candidates, refused replies.
    rounds: list[dict[str, float]]


class APOState:
    """Everything a run has done, rebuilt from the store (snapshots + validation rollouts)."""

    def __init__(self, run_id: str, candidates: dict[str, Candidate]) -> None:
        self.run_id = run_id
        self.candidates = candidates

    @classmethod
    def load(cls, store: Store, run_id: str, prompt_name: str) -> APOState:
        """Read a run back; scores are filled for candidates whose validation has finished."""
        candidates: dict[str, Candidate] = {}
        for snapshot in store.query_resources():
            meta = snapshot.items.get(APO_ITEM)
            if not isinstance(meta, JsonResource) or not isinstance(meta.value, dict):
                continue
            info = meta.value
            if info.get("run_id") != run_id or info.get("kind") != "candidate":
                continue
            template = snapshot.items.get(prompt_name)
            if not isinstance(template, PromptTemplate):
                continue
            candidate = Candidate(
                snapshot.resources_id,
                snapshot.version,
                template,
                int(info["round"]),
                info.get("parent"),
                info.get("critique"),
            )
            rollouts = store.query_rollouts(RolloutFilter(group_id=val_group(run_id, candidate.resources_id)))
            if rollouts and all(r.status.is_terminal for r in rollouts):
                candidate.score = score_of(rollouts)
            candidates[candidate.resources_id] = candidate
        return cls(run_id, candidates)

    def ranked(self, max_round: int | None = None) -> list[Candidate]:
        """Scored candidates (up to ``max_round``), best first; ties go to the older snapshot."""
        scored = [
            c for c in self.candidates.values() if c.score is not None and (max_round is None or c.round <= max_round)
        ]
        return sorted(scored, key=lambda c: (-c.score, c.version))  # type: ignore[operator]

    def children(self, parent: str, round_: int) -> list[Candidate]:
        return [c for c in self.candidates.values() if c.parent == parent and c.round == round_]


def val_group(run_id: str, resources_id: str) -> str:
    return f"apo:{run_id}:val:{resources_id}"


def critique_group(run_id: str, round_: int, resources_id: str) -> str:
    return f"apo:{run_id}:r{round_}:critique:{resources_id}"


def score_of(rollouts: Sequence[Rollout]) -> float:
    """Mean reward; a rollout that failed or gave no reward counts 0 (the prompt did not work)."""
    return statistics.fmean(r.reward if r.reward is not None else 0.0 for r in rollouts)


def candidate_id(run_id: str, template: PromptTemplate) -> str:
    digest = hashlib.sha256(f"{template.engine}\0{template.template}".encode()).hexdigest()[:12]
    return f"apo-{run_id}-{digest}"


def render_trace(store: Store, rollout: Rollout, max_chars: int) -> str:
    """A compact, human-readable account of a rollout's latest attempt for the critic, one line
    per event in the order the events completed (not the order the store received them: LLM calls
    are stored behind their answers, see :mod:`agentgrad.adapters.timeline`)."""
    spans = sorted(store.query_spans(rollout.rollout_id, "latest"), key=by_done)
    lines: list[str] = []
    calls = {c.span_id: c for c in extract_calls(spans)}
    for span in spans:
        attrs = span.attributes
        if span.span_id in calls:
            call = calls[span.span_id]
            last_user: dict[str, Any] = next(
                (m for m in reversed(call.request_messages) if m.get("role") in ("user", "tool")), {}
            )
            lines.append(f"[llm] {last_user.get('role', 'user')}: {last_user.get('content', '')}")
            tools = "; ".join(json.dumps(t.get("function", t)) for t in call.tool_calls)
            lines.append(f"[llm] assistant: {call.assistant_text}" + (f" (tool calls: {tools})" if tools else ""))
        elif span.name == semconv.SPAN_MESSAGE:
            lines.append(f"[message] {attrs.get(semconv.MESSAGE_BODY, '')}")
        elif span.name == semconv.SPAN_OBJECT:
            lines.append(f"[object] {attrs.get(semconv.OBJECT_JSON, '')}")
        elif span.name == semconv.SPAN_EXCEPTION:
            lines.append(f"[exception] {attrs.get(semconv.EXCEPTION_TYPE)}: {attrs.get(semconv.EXCEPTION_MESSAGE)}")
        elif span.name == semconv.SPAN_OPERATION and semconv.OPERATION_OUTPUT in attrs:
            lines.append(
                f"[{attrs.get(semconv.OPERATION_NAME)}] {json.dumps(attrs.get(semconv.OPERATION_INPUT))}"
                f" → {json.dumps(attrs[semconv.OPERATION_OUTPUT])}"
            )
    if rollout.status != RolloutStatus.SUCCEEDED:
        attempt = store.get_latest_attempt(rollout.rollout_id)
        error = attempt.error if attempt else None
        lines.append(f"[failed] {error.type}: {error.message}" if error else f"[{rollout.status.value}]")
    text = "\n".join(lines) or "(no trace recorded)"
    return text if len(text) <= max_chars else text[: max_chars - 15] + "\n…(truncated)"


class APO(Algorithm):
    """Beam search over prompt templates with critic/editor LLMs (see the module docstring).

    Args:
        critic: endpoint that reads traces and writes critiques.
        editor: endpoint that rewrites prompts (default: the critic).
        prompt_name: the resources item holding the prompt the agent uses.
        initial_prompt: the seed prompt; default: ``prompt_name`` in the Trainer's resources, else
            in the store's latest snapshot.
        variables: variables the agent supplies to the template (default: those the seed uses).
            An edit reading any other variable is refused.
        required_variables: variables every candidate must keep (default: those the seed uses).
        beam_width / branch_factor / rounds: the search shape.
        train_batch_size: rollouts per beam prompt per round shown to the critic.
        val_batch_size: validation tasks every candidate is scored on (the same ones for all).
        run_id: names the run in the store; running again with the same id resumes it.
        rollout_config: per-rollout time limits and retries.
        wait_timeout: give up when a batch has not finished after this many seconds.
    """

    def __init__(
        self,
        critic: ChatEndpoint,
        editor: ChatEndpoint | None = None,
        *,
        prompt_name: str = "prompt_template",
        initial_prompt: PromptTemplate | str | None = None,
        variables: Iterable[str] | None = None,
        required_variables: Iterable[str] | None = None,
        beam_width: int = 2,
        branch_factor: int = 2,
        rounds: int = 3,
        train_batch_size: int = 8,
        val_batch_size: int = 16,
        run_id: str = "apo",
        seed: int = 0,
        rollout_config: RolloutConfig | None = None,
        wait_timeout: float | None = None,
        max_trace_chars: int = 1500,
        max_prompt_chars: int = 8000,
    ) -> None:
        for name, value in (
            ("beam_width", beam_width),
            ("branch_factor", branch_factor),
            ("train_batch_size", train_batch_size),
            ("val_batch_size", val_batch_size),
        ):
            if value < 1:
                raise ValueError(f"{name} must be ≥ 1, got {value}")
        if rounds < 0:
            raise ValueError(f"rounds must be ≥ 0, got {rounds}")
        self.critic = critic
        self.editor = editor or critic
        self.prompt_name = prompt_name
        self.initial_prompt = (
            PromptTemplate(template=initial_prompt) if isinstance(initial_prompt, str) else initial_prompt
        )
        self.variables = set(variables) if variables is not None else None
        self.required_variables = set(required_variables) if required_variables is not None else None
        self.beam_width, self.branch_factor, self.rounds = beam_width, branch_factor, rounds
        self.train_batch_size, self.val_batch_size = train_batch_size, val_batch_size
        self.run_id, self.seed = run_id, seed
        self.rollout_config = rollout_config or RolloutConfig()
        self.wait_timeout = wait_timeout
        self.max_trace_chars, self.max_prompt_chars = max_trace_chars, max_prompt_chars
        self.state: APOState | None = None
        # Set by run() from the seed: what every published candidate is checked against.
        self._allowed: set[str] = set()
        self._required: set[str] = set()
        self._base_items: dict[str, Any] = {}

    # ---- public ---------------------------------------------------------------------------------
    def best_prompt(self, store: Store | None = None) -> PromptTemplate:
        """The best prompt of this run: from the last ``run()``, or read back from ``store``."""
        state = APOState.load(store, self.run_id, self.prompt_name) if store is not None else self.state
        ranked = state.ranked() if state is not None else []
        if not ranked:
            raise APOError(f"APO run {self.run_id!r} has no evaluated prompt yet")
        return ranked[0].template

    def run(self, context: AlgorithmContext) -> APOResult:
        store = context.store
        train_tasks = list(context.train_tasks)
        val_tasks = list(context.val_tasks) or train_tasks
        if not train_tasks:
            raise APOError("APO needs train tasks (the critic reads rollouts of them)")
        seed_template, base_items = self._seed_and_items(context)
        allowed = self.variables if self.variables is not None else seed_template.referenced_variables()
        required = (
            self.required_variables if self.required_variables is not None else seed_template.referenced_variables()
        )
        validate_template(seed_template, allowed, required)  # a bad seed is refused, naming the variables
        self._allowed, self._required, self._base_items = allowed, required, base_items
        self.state = state = APOState.load(store, self.run_id, self.prompt_name)
        if state.candidates:
            context.console.print(f"APO run {self.run_id!r}: resuming with {len(state.candidates)} stored candidate(s)")
        val_batch = _sample(val_tasks, self.val_batch_size, f"{self.seed}:val")
        seed = (
            self._publish(store, seed_template, round_=0, parent=None, critique=None)
            or state.candidates[candidate_id(self.run_id, seed_template)]
        )
        self._evaluate(store, [seed], val_batch)
        context.console.print(f"APO round 0: seed prompt scores {seed.score:.3f}")
        history: list[dict[str, float]] = []
        for round_ in range(1, self.rounds + 1):
            beam = state.ranked(max_round=round_ - 1)[: self.beam_width]
            train_batch = _sample(train_tasks, self.train_batch_size, f"{self.seed}:train:{round_}")
            children, rejected = self._expand(store, beam, round_, train_batch)
            self._evaluate(store, children, val_batch)
            ranked = state.ranked(max_round=round_)
            summary = {
                "best_score": float(ranked[0].score),  # type: ignore[arg-type]
                "beam_mean": statistics.fmean(c.score for c in ranked[: self.beam_width]),  # type: ignore[misc]
                "new_candidates": float(len(children)),
                "rejected_replies": float(rejected),
            }
            history.append(summary)
            self._record(store, f"apo:{self.run_id}", round_, summary)
            context.console.print(
                f"APO round {round_}: {len(children)} new candidate(s), {rejected} refused "
                f"reply(ies); best {summary['best_score']:.3f}, beam mean {summary['beam_mean']:.3f}"
            )
        best = state.ranked()[0]
        self._publish_best(store, best)
        return APOResult(
            best=best, seed=seed, candidates=sorted(state.candidates.values(), key=lambda c: c.version), rounds=history
        )

    # ---- seed -----------------------------------------------------------------------------------
    def _seed_and_items(self, context: AlgorithmContext) -> tuple[PromptTemplate, dict[str, Any]]:
        """The seed prompt and the other resources every candidate snapshot carries along."""
        items: dict[str, Any] = dict(context.initial_resources or {})
        if not items:
            latest = context.store.get_latest_resources()
            items = dict(latest.items) if latest is not None else {}
        items.pop(APO_ITEM, None)
        found = items.pop(self.prompt_name, None)
        seed = self.initial_prompt or found
        if isinstance(seed, dict):
            seed = PromptTemplate.model_validate(seed)
        elif isinstance(seed, str):
            seed = PromptTemplate(template=seed)
        if not isinstance(seed, PromptTemplate):
            raise APOError(
                f"APO needs a seed prompt: pass initial_prompt=… or a PromptTemplate resource named "
                f"{self.prompt_name!r} (found {type(seed).__name__})"
            )
        return seed, items

    # ---- publishing -------------------------------------------------------------------------------
    def _publish(
        self, store: Store, template: PromptTemplate, *, round_: int, parent: str | None, critique: str | None
    ) -> Candidate | None:
        """Validate and publish a candidate; None when the same prompt is already a candidate."""
        validate_template(template, self._allowed, self._required)
        resources_id = candidate_id(self.run_id, template)
        assert self.state is not None
        if resources_id in self.state.candidates:
            return None
        lineage = {
            "run_id": self.run_id,
            "kind": "candidate",
            "round": round_,
            "parent": parent,
            "critique": critique,
            "prompt_name": self.prompt_name,
        }
        items = {**self._base_items, self.prompt_name: template, APO_ITEM: JsonResource(value=lineage)}
        try:
            snapshot = store.add_resources(items, resources_id=resources_id)
        except AlreadyExistsError:  # published by an earlier process of this run, then it crashed
            snapshot = store.get_resources(resources_id)
        candidate = Candidate(resources_id, snapshot.version, template, round_, parent, critique)
        self.state.candidates[resources_id] = candidate
        return candidate

    def _publish_best(self, store: Store, best: Candidate) -> None:
        """Make the winner the latest snapshot (once per winner), for agents started later."""
        items = {
            **self._base_items,
            self.prompt_name: best.template,
            APO_ITEM: JsonResource(
                value={"run_id": self.run_id, "kind": "best", "source": best.resources_id, "score": best.score}
            ),
        }
        try:
            store.add_resources(items, resources_id=f"{best.resources_id}-best")
        except AlreadyExistsError:
            pass

    # ---- rollouts ---------------------------------------------------------------------------------
    def _batch(self, store: Store, groups: dict[str, tuple[str, RolloutMode, list[Any]]]) -> dict[str, list[Rollout]]:
        """Finished rollouts per group, enqueuing the groups not in the store yet.

        ``groups`` maps group id → (resources id, mode, tasks). A group is enqueued atomically,
        so after a crash it is either complete in the store (reused) or absent (enqueued now).
        """
        ids: dict[str, list[str]] = {}
        for group, (resources_id, mode, tasks) in groups.items():
            existing = store.query_rollouts(RolloutFilter(group_id=group))
            if not existing:
                existing = store.enqueue_rollouts(
                    [
                        RolloutRequest(
                            input=task,
                            mode=mode,
                            resources_id=resources_id,
                            config=self.rollout_config,
                            metadata={"group_id": group, "apo_run": self.run_id},
                        )
                        for task in tasks
                    ]
                )
            ids[group] = [r.rollout_id for r in existing]
        every = [rid for group_ids in ids.values() for rid in group_ids]
        # Scores from part of a batch would compare candidates unfairly: stop instead, leaving the
        # stragglers running; a resumed run finds their groups in the store and waits again.
        try:
            batch = wait_batch(store, every, timeout=self.wait_timeout, on_straggler="raise", label="APO")
        except StragglersError as exc:
            raise APOError(f"{exc} (the run resumes later)") from exc
        by_id = {r.rollout_id: r for r in batch.rollouts}
        return {group: [by_id[rid] for rid in group_ids] for group, group_ids in ids.items()}

    def _evaluate(self, store: Store, candidates: list[Candidate], val_batch: list[Any]) -> None:
        """Score candidates on the validation batch (all candidates' rollouts run together)."""
        pending = [c for c in candidates if c.score is None]
        groups: dict[str, tuple[str, RolloutMode, list[Any]]] = {
            val_group(self.run_id, c.resources_id): (c.resources_id, "val", val_batch) for c in pending
        }
        results = self._batch(store, groups)
        for candidate in pending:
            candidate.score = score_of(results[val_group(self.run_id, candidate.resources_id)])
            self._record(
                store,
                f"apo:{self.run_id}:candidates",
                candidate.version,
                {"val_score": candidate.score, "round": float(candidate.round)},
            )

    @staticmethod
    def _record(store: Store, run: str, step: int, values: dict[str, float]) -> None:
        """Append a metric once per (run, step): a resumed run does not log a step twice."""
        if all(m.step != step for m in store.query_metrics(run)):
            with RunLog(None, store, run) as run_log:
                run_log.log(step, values)

    # ---- critic and editor --------------------------------------------------------------------------
    def _expand(
        self, store: Store, beam: list[Candidate], round_: int, train_batch: list[Any]
    ) -> tuple[list[Candidate], int]:
        """Critique every beam prompt on its own rollouts and publish the editor's proposals."""
        assert self.state is not None
        groups: dict[str, tuple[str, RolloutMode, list[Any]]] = {
            critique_group(self.run_id, round_, p.resources_id): (p.resources_id, "train", train_batch) for p in beam
        }
        batches = self._batch(store, groups)
        workers = max(1, min(len(beam) * self.branch_factor, self.critic.concurrency + self.editor.concurrency))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="apo") as pool:
            critiques = list(
                pool.map(
                    lambda p: self._critique(store, p, batches[critique_group(self.run_id, round_, p.resources_id)]),
                    beam,
                )
            )
            jobs = [
                (parent, critique)
                for parent, critique in zip(beam, critiques, strict=True)
                if critique is not None
                for _ in range(self.branch_factor - len(self.state.children(parent.resources_id, round_)))
            ]
            replies = list(pool.map(lambda job: self._edit(*job), jobs))
        children: list[Candidate] = []
        rejected: dict[str, list[dict[str, str]]] = {}
        for (parent, critique), reply in zip(jobs, replies, strict=True):
            outcome = self._adopt(store, reply, parent, critique, round_)
            if isinstance(outcome, Candidate):
                children.append(outcome)
            else:
                log.warning(
                    "APO round %d: editor reply for %s refused: %s; it began %r",
                    round_,
                    parent.resources_id,
                    outcome,
                    reply[:120],
                )
                rejected.setdefault(parent.resources_id, []).append({"reason": outcome, "reply": reply[:500]})
        refused_critiques = sum(c is None for c in critiques)
        for parent_id, entries in rejected.items():
            for rollout in batches[critique_group(self.run_id, round_, parent_id)]:
                store.update_rollout_metadata(rollout.rollout_id, {"apo_rejected": entries})
        resumed = [
            c
            for p in beam
            for c in self.state.children(p.resources_id, round_)
            if all(c is not new for new in children)
        ]
        return resumed + children, refused_critiques + sum(map(len, rejected.values()))

    def _critique(self, store: Store, parent: Candidate, rollouts: list[Rollout]) -> str | None:
        """The critic's text for one beam prompt (reused from the store on resume); None if unusable."""
        stored = rollouts[0].metadata.get("apo_critique") if rollouts else None
        if stored:
            return str(stored)
        runs = []
        for number, rollout in enumerate(sorted(rollouts, key=lambda r: r.reward or 0.0), 1):
            reward = "none (failed)" if rollout.reward is None else f"{rollout.reward:g}"
            runs.append(
                f"### Run {number} — reward {reward}\nTask: {json.dumps(rollout.input)}\n"
                f"Trace:\n{render_trace(store, rollout, self.max_trace_chars)}"
            )
        user = (
            f"## Prompt template ({parent.template.engine})\n<prompt>\n{parent.template.template}\n</prompt>\n\n"
            f"## Runs with this prompt (worst first)\n\n" + "\n\n".join(runs)
        )
        reply = self.critic.complete([{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}])
        if not reply.strip():
            log.warning(
                "APO: critic gave an empty critique for %s; skipping this prompt this round", parent.resources_id
            )
            for rollout in rollouts:
                store.update_rollout_metadata(
                    rollout.rollout_id, {"apo_rejected": [{"reason": "empty critique", "reply": reply[:500]}]}
                )
            return None
        for rollout in rollouts:
            store.update_rollout_metadata(rollout.rollout_id, {"apo_critique": reply})
        return reply

    def _edit(self, parent: Candidate, critique: str) -> str:
        allowed = ", ".join(sorted(self._allowed)) or "none"
        user = (
            f"## Current prompt template ({parent.template.engine} syntax; available variables: {allowed})\n"
            f"<prompt>\n{parent.template.template}\n</prompt>\n\n## Critique\n{critique}\n\n"
            "Reply with the complete revised template inside <prompt></prompt>."
        )
        return self.editor.complete([{"role": "system", "content": EDITOR_SYSTEM}, {"role": "user", "content": user}])

    def _adopt(self, store: Store, reply: str, parent: Candidate, critique: str, round_: int) -> Candidate | str:
        """Publish the editor's proposal, or return why it is not a usable prompt."""
        blocks = _PROMPT_BLOCK.findall(reply)
        if not blocks:
            return "no <prompt>…</prompt> block in the reply"
        text = blocks[-1].strip("\n")
        if not text.strip():
            return "the proposed prompt is empty"
        if len(text) > self.max_prompt_chars:
            return f"the proposed prompt is {len(text)} characters (limit {self.max_prompt_chars})"
        template = PromptTemplate(template=text, engine=parent.template.engine)
        try:
            candidate = self._publish(store, template, round_=round_, parent=parent.resources_id, critique=critique)
        except TemplateError as exc:
            return str(exc)
        return candidate if candidate is not None else "the proposed prompt is already a candidate"


def _sample(tasks: list[Any], n: int, salt: str) -> list[Any]:
    """A deterministic sample (all tasks when there are at most ``n``), so a resumed run asks the same."""
    return list(tasks) if len(tasks) <= n else random.Random(salt).sample(tasks, n)
