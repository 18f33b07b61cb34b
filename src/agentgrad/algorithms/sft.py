"""SFT: rejection-sampling fine-tuning on the agent's own successful traces, and data export.

Rejection sampling: let the current policy attempt the tasks (through the normal path: store →
runners → proxy → engine, so every call is captured with its exact token ids), keep only what
earned enough reward, train on it with NLL, publish the new weights, repeat. It is the simplest
way to turn "sometimes right" into "usually right", and the same selection feeds external
trainers through :func:`export_samples` (``agentgrad export``).

Selection (:class:`SelectionCriteria`) is a funnel over the store, and every stage is counted:
succeeded rollouts → mode → recency (``since``, ``newest``) → ``min_reward`` → captured LLM calls
→ ``agent_match`` → (training only) calls with token ids → de-duplication. An empty result names
the stage that removed everything (:class:`EmptySelectionError`), because "trained on nothing"
is the most common silent failure of agent training pipelines.

Two views of the same selection:

* **transitions** (token ids, prefix-merged multi-turn sequences with tool outputs masked) —
  what :class:`SFT` trains on, via the shared :mod:`agentgrad.training` module;
* **chat samples** (``{"messages", "tools", "metadata"}``) — what is exported as JSONL or
  Parquet. Within a rollout, a call whose conversation is continued by the next call of the same
  agent is folded into it, so each multi-turn conversation is exported once, complete.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agentgrad.adapters.calls import LLMCall, extract_calls, matches_agent
from agentgrad.adapters.transitions import TransitionAdapter
from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.algorithms.batch import run_batch
from agentgrad.algorithms.runlog import RunLog
from agentgrad.algorithms.validation import BestModel, with_sampling
from agentgrad.errors import AgentGradError
from agentgrad.store.protocol import RolloutFilter, RolloutRequest, Store
from agentgrad.training.policy import TrainConfig  # a dataclass: importing it loads no torch
from agentgrad.types import (
    JsonResource,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Transition,
)

if TYPE_CHECKING:
    from agentgrad.training import Published, Publisher, StepMetrics
    from agentgrad.training.backend import TrainBackend

log = logging.getLogger(__name__)

ExportFormat = Literal["jsonl", "parquet"]


class EmptySelectionError(AgentGradError):
    """The selection kept nothing; the message names the filter that removed everything."""


@dataclass
class SelectionCriteria:
    """Which stored traces to learn from.

    Args:
        min_reward: keep rollouts whose final reward is ≥ this (None: any reward, even none).
        agent_match: regex (``re.search``) on the agent name of each LLM call; None keeps all.
        modes: rollout modes to use; validation/test rollouts are excluded by default so that
            evaluation data never leaks into training.
        since: only rollouts that ended at or after this time (epoch seconds).
        newest: only the ``newest`` most recently finished rollouts (applied after ``since``).
        dedupe: drop exact duplicates (same tokens, or same conversation).
    """

    min_reward: float | None = 1.0
    agent_match: str | None = None
    modes: tuple[RolloutMode, ...] = ("train",)
    since: float | None = None
    newest: int | None = None
    dedupe: bool = True

    def __post_init__(self) -> None:
        if self.newest is not None and self.newest < 1:
            raise ValueError(f"newest must be ≥ 1, got {self.newest}")
        if self.agent_match is not None:
            re.compile(self.agent_match)  # a bad regex fails here, naming itself, not mid-run


@dataclass
class Funnel:
    """How many items were left after each selection stage, in order."""

    stages: list[tuple[str, int]] = field(default_factory=list)

    def add(self, stage: str, remaining: int) -> None:
        self.stages.append((stage, remaining))

    def require_nonempty(self) -> None:
        """Raise :class:`EmptySelectionError` naming the first stage that left nothing."""
        before = None
        for stage, remaining in self.stages:
            if remaining == 0:
                had = "" if before is None else f" (all {before[1]} left after '{before[0]}')"
                raise EmptySelectionError(
                    f"the selection is empty: '{stage}' removed everything{had}. Funnel: {self.describe()}"
                )
            before = (stage, remaining)

    def describe(self) -> str:
        return " → ".join(f"{stage}: {n}" for stage, n in self.stages)


def select_rollouts(store: Store, criteria: SelectionCriteria, funnel: Funnel) -> list[Rollout]:
    """Succeeded rollouts passing the mode, recency and reward filters, newest first."""
    rollouts = store.query_rollouts(
        RolloutFilter(status=[RolloutStatus.SUCCEEDED], sort_by="end_time", descending=True)
    )
    funnel.add("succeeded rollouts in the store", len(rollouts))
    rollouts = [r for r in rollouts if r.mode in criteria.modes]
    funnel.add(f"mode in {list(criteria.modes)}", len(rollouts))
    if criteria.since is not None:
        rollouts = [r for r in rollouts if (r.end_time or 0.0) >= criteria.since]
        funnel.add(f"ended since {criteria.since}", len(rollouts))
    if criteria.newest is not None:
        rollouts = rollouts[: criteria.newest]
        funnel.add(f"newest {criteria.newest}", len(rollouts))
    if criteria.min_reward is not None:
        rollouts = [r for r in rollouts if r.reward is not None and r.reward >= criteria.min_reward]
        funnel.add(f"reward >= {criteria.min_reward}", len(rollouts))
    return rollouts


_T = TypeVar("_T")


def _dedupe(items: Sequence[_T], key: Callable[[_T], Hashable]) -> list[_T]:
    """``items`` without repeats of ``key``, first occurrence kept, order preserved."""
    seen: set[Hashable] = set()
    unique = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            unique.append(item)
    return unique


def select_transitions(store: Store, criteria: SelectionCriteria) -> tuple[list[Transition], Funnel]:
    """Token-level training sequences of the selected rollouts (raises when none are left)."""
    funnel = Funnel()
    rollouts = select_rollouts(store, criteria, funnel)
    adapter = TransitionAdapter(credit="final", agent_match=criteria.agent_match, merge=True)
    transitions, stats = adapter.adapt(store, rollouts)
    funnel.add("captured LLM calls", stats.calls)
    if criteria.agent_match:
        funnel.add(f"agent matches {criteria.agent_match!r}", stats.calls - stats.calls_other_agents)
    funnel.add("calls with token ids", stats.calls - stats.calls_other_agents - len(stats.calls_without_token_ids))
    funnel.add("sequences after merging multi-turn calls", len(transitions))
    if criteria.dedupe:
        transitions = _dedupe(transitions, lambda t: (tuple(t.prompt_ids), tuple(t.response_ids)))
        funnel.add("unique sequences", len(transitions))
    funnel.require_nonempty()
    return transitions, funnel


def _chat_sample(call: LLMCall, rollout: Rollout) -> dict[str, Any] | None:
    """The call as a chat conversation ending in the assistant's reply (None: not a chat call)."""
    if not call.request_messages or not call.response.get("choices"):
        return None
    message = call.response["choices"][0].get("message") or {}
    reply: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        reply["tool_calls"] = message["tool_calls"]
    sample: dict[str, Any] = {"messages": [*call.request_messages, reply]}
    if call.request.get("tools"):
        sample["tools"] = call.request["tools"]
    sample["metadata"] = {
        "rollout_id": rollout.rollout_id,
        "call_index": call.index,
        "agent_name": call.agent_name,
        "reward": rollout.reward,
        "model_version": call.model_version,
    }
    return sample


def _continues(later: dict[str, Any], earlier: dict[str, Any]) -> bool:
    """Whether ``later``'s conversation starts with all of ``earlier``'s (incl. its reply)."""
    prefix = earlier["messages"]
    return later["metadata"]["agent_name"] == earlier["metadata"]["agent_name"] and _comparable(
        later["messages"][: len(prefix)]
    ) == _comparable(prefix)


def _comparable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # A client re-sending an assistant turn may drop null fields or re-serialize tool calls.
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


def select_chat_samples(store: Store, criteria: SelectionCriteria) -> tuple[list[dict[str, Any]], Funnel]:
    """Chat conversations of the selected rollouts (raises when none are left)."""
    funnel = Funnel()
    pattern = re.compile(criteria.agent_match) if criteria.agent_match else None
    calls_total = matched = 0
    samples: list[dict[str, Any]] = []
    for rollout in select_rollouts(store, criteria, funnel):
        calls = extract_calls(store.query_spans(rollout.rollout_id, "latest"))
        calls_total += len(calls)
        mine = [c for c in calls if matches_agent(c, pattern)]
        matched += len(mine)
        conversation = [s for s in (_chat_sample(c, rollout) for c in mine) if s is not None]
        samples.extend(
            s
            for s, nxt in zip(conversation, [*conversation[1:], None][: len(conversation)], strict=True)
            if nxt is None or not _continues(nxt, s)
        )
    funnel.add("captured LLM calls", calls_total)
    if criteria.agent_match:
        funnel.add(f"agent matches {criteria.agent_match!r}", matched)
    funnel.add("chat conversations (multi-turn folded)", len(samples))
    if criteria.dedupe:
        samples = _dedupe(samples, lambda s: json.dumps([s["messages"], s.get("tools")], sort_keys=True))
        funnel.add("unique conversations", len(samples))
    funnel.require_nonempty()
    return samples, funnel


def export_samples(samples: Sequence[dict[str, Any]], output: str | Path, format: ExportFormat | None = None) -> Path:
    """Write chat samples for external trainers; the format defaults to the file's suffix.

    JSONL: one ``{"messages", "tools"?, "metadata"}`` object per line (the OpenAI / TRL chat
    format). Parquet: columns ``messages`` and ``tools`` hold JSON text (lossless whatever the
    message shapes: text or multimodal content, tool calls), plus flat metadata columns for
    filtering; ``json.loads`` the two columns to get the JSONL objects back.
    """
    path = Path(output)
    fmt = format or ("parquet" if path.suffix == ".parquet" else "jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with path.open("w") as out:
            for sample in samples:
                out.write(json.dumps(sample, ensure_ascii=False) + "\n")
        return path
    if fmt != "parquet":
        raise ValueError(f"format must be 'jsonl' or 'parquet', got {fmt!r}")
    try:
        import pyarrow as pa  # lazy: only Parquet export needs it
        import pyarrow.parquet as pq
    except ImportError:
        raise AgentGradError("Parquet export needs pyarrow: pip install pyarrow") from None
    columns: dict[str, list[Any]] = {
        "messages": [json.dumps(s["messages"], ensure_ascii=False) for s in samples],
        "tools": [json.dumps(s["tools"], ensure_ascii=False) if s.get("tools") else None for s in samples],
    }
    for key, kind in (
        ("rollout_id", pa.string()),
        ("call_index", pa.int64()),
        ("agent_name", pa.string()),
        ("reward", pa.float64()),
        ("model_version", pa.string()),
    ):
        columns[key] = pa.array([s["metadata"].get(key) for s in samples], type=kind)
    pq.write_table(pa.table(columns), path)
    return path


class SaveToDirectory:
    """A publisher for runs without a serving engine: writes a loadable Hugging Face model
    directory (LoRA merged in, tokenizer copied) to ``output_dir/step-N``."""

    def __init__(self, output_dir: str | Path) -> None:
        self.output_dir = Path(output_dir)

    def publish(self, trainer: TrainBackend) -> Published:
        from agentgrad.training import Published
        from agentgrad.training.backend import export_policy

        return Published(version=str(export_policy(trainer, self.output_dir / f"step-{trainer.step:06d}")))


@dataclass
class SFTConfig:
    """The settings of an SFT run as ``agentgrad train --algorithm sft`` and config files give
    them (:meth:`SFT.from_config`); the Python API takes the same values as keyword arguments."""

    iterations: int = 1
    """Rounds of sample → select → train → publish."""
    samples_per_task: int = 4
    """Rollouts of each train task per iteration (0: train on what the store already holds)."""
    min_reward: float = 1.0
    """Keep rollouts whose reward is at least this."""
    steps: int = 20
    """NLL optimizer steps per iteration."""
    batch_size: int = 16
    """Sequences per optimizer step."""
    agent_match: str | None = None
    """Regex on each LLM call's agent name: train only the matching agents (None: all)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimizer and LoRA settings of the policy trainer (``lr: null`` picks a default for the model's size)."""
    rollout_timeout_seconds: float | None = None
    """Seconds one rollout may run before it is ended as timed out (None: no limit)."""
    batch_timeout: float | None = 600.0
    """Seconds one iteration's sampling (or one validation) may take; rollouts still running then
    stop the run with an error (validation: they are cancelled and score 0)."""
    output_dir: str = "runs/sft"
    """Where the final model (``model/``), the best-validation one (``best/``) and checkpoints go."""
    resume: bool = False
    """Continue from the latest checkpoint in ``output_dir/checkpoints``."""
    run_id: str = "sft"
    """Name of the run in the store (metrics appear as run ``sft:<run_id>``)."""

    def __post_init__(self) -> None:
        for name in ("iterations", "steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTConfig.{name} must be ≥ 1, got {getattr(self, name)!r}")
        if self.samples_per_task < 0:
            raise ValueError(f"SFTConfig.samples_per_task must be ≥ 0, got {self.samples_per_task!r}")


@dataclass
class SFTResult:
    """What ``Trainer.fit()`` returns for SFT: per iteration, the data it saw and what it published."""

    funnels: list[Funnel]
    samples: list[int]
    versions: list[str]
    history: list[StepMetrics]
    #: (iteration, greedy validation reward mean) — iteration 0 is before any training.
    validation: list[tuple[int, float]] = field(default_factory=list)
    #: The iteration and validation score of the best model (exported to ``output_dir/best``).
    best_iteration: int | None = None
    best_score: float | None = None
    #: The final model's directory (``output_dir/model``); None without ``output_dir``.
    model: Path | None = None


class SFT(Algorithm):
    """Rejection-sampling fine-tuning with the shared training module.

    Each of ``iterations``: run every train task ``samples_per_task`` times with the latest
    resources (skipped when 0, or when no train tasks are given: then SFT trains on what the
    store already holds), select by ``criteria``, train ``steps`` NLL steps, publish the weights
    (``publisher``; default: the engine of ``Trainer(policy=…)``), and publish a resources
    snapshot naming the new policy version (and model name, for LoRA-serving backends).

    Args:
        model_dir: the policy's Hugging Face directory (the weights the engine serves).
        train_config: optimizer, LoRA (``TrainConfig(lora=LoraSettings())``) or full fine-tuning.
        checkpoint_dir: resume point; training continues from its latest checkpoint.
        wait_timeout: how long one iteration's sampling may take (None: no limit); rollouts still
            running then stop the run with an error asking whether runners serve the agent.
        output_dir: where to export the final model (``model/``) and, with validation tasks
            (``Trainer.fit(..., val_tasks)``), the best one (``best/``, validated greedily before
            the first iteration and after each). None: nothing is exported.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        criteria: SelectionCriteria | None = None,
        train_config: TrainConfig | None = None,
        iterations: int = 1,
        samples_per_task: int = 1,
        steps: int = 20,
        batch_size: int = 16,
        publisher: Publisher | None = None,
        checkpoint_dir: str | Path | None = None,
        rollout_config: RolloutConfig | None = None,
        wait_timeout: float | None = None,
        run_id: str = "sft",
        output_dir: str | Path | None = None,
    ) -> None:
        if iterations < 1 or steps < 1 or batch_size < 1 or samples_per_task < 0:
            raise ValueError("iterations, steps and batch_size must be ≥ 1 and samples_per_task ≥ 0")
        self.model_dir = Path(model_dir)
        self.criteria = criteria or SelectionCriteria()
        self.train_config = train_config
        self.iterations, self.samples_per_task = iterations, samples_per_task
        self.steps, self.batch_size = steps, batch_size
        self.publisher = publisher
        self.checkpoint_dir = checkpoint_dir
        self.rollout_config = rollout_config or RolloutConfig()
        self.wait_timeout = wait_timeout
        self.run_id = run_id
        self.output_dir = Path(output_dir) if output_dir is not None else None
        # What run() sets up: whether it validates, and the best model so far.
        self._validating = False
        self.best: BestModel | None = None

    @classmethod
    def from_config(cls, model_dir: str | Path, config: SFTConfig, *, publisher: Publisher | None = None) -> SFT:
        """An SFT run with the settings of ``config``, exporting to ``config.output_dir``."""
        out = Path(config.output_dir)
        return cls(
            model_dir,
            criteria=SelectionCriteria(min_reward=config.min_reward, agent_match=config.agent_match),
            train_config=config.train,
            iterations=config.iterations,
            samples_per_task=config.samples_per_task,
            steps=config.steps,
            batch_size=config.batch_size,
            publisher=publisher,
            checkpoint_dir=out / "checkpoints" if config.resume else None,
            rollout_config=RolloutConfig(timeout_seconds=config.rollout_timeout_seconds),
            wait_timeout=config.batch_timeout,
            run_id=config.run_id,
            output_dir=out,
        )

    def _publisher(self, context: AlgorithmContext) -> Publisher:
        if self.publisher is not None:
            return self.publisher
        if context.policy is None:
            raise AgentGradError(
                "SFT needs somewhere to publish the weights: SFT(publisher=…) "
                "(e.g. SaveToDirectory(path)) or Trainer(policy=LocalPolicy(model_dir))"
            )
        return context.policy.publisher()

    def _collect(self, context: AlgorithmContext, iteration: int) -> None:
        """Let the current policy attempt every train task (the "sampling" of rejection sampling)."""
        store = context.store
        latest = store.get_latest_resources()
        requests = [
            RolloutRequest(
                input=task,
                mode="train",
                config=self.rollout_config,
                resources_id=latest.resources_id if latest else None,
                metadata={"sft_run": self.run_id, "sft_iteration": iteration},
            )
            for task in context.train_tasks
            for _ in range(self.samples_per_task)
        ]
        with context.console.status(f"SFT iteration {iteration}: running {len(requests)} rollout(s)…"):
            run_batch(
                store, requests, timeout=self.wait_timeout, on_straggler="raise", label=f"SFT iteration {iteration}"
            )

    def _announce(self, store: Store, published: Published) -> str | None:
        """A resources snapshot naming the new policy, so rollouts record what they ran on."""
        latest = store.get_latest_resources()
        items: dict[str, Any] = with_sampling(dict(latest.items) if latest is not None else {}, {}, published.model)
        items["policy_version"] = JsonResource(value=published.version)
        return self._add_resources(store, items)

    def _add_resources(self, store: Store, items: dict[str, Any]) -> str | None:
        """Add ``items`` as the latest snapshot (the one sampling uses); when validating, first its
        greedy twin, whose id is returned."""
        greedy = store.add_resources(with_sampling(items, {"temperature": 0.0})) if self._validating else None
        store.add_resources(items)
        return greedy.resources_id if greedy is not None else None

    def _validate(
        self, context: AlgorithmContext, iteration: int, trainer: TrainBackend, resources_id: str | None
    ) -> None:
        assert self.best is not None
        self.best.validate(
            context.store, context.val_tasks, iteration, trainer, resources_id=resources_id, console=context.console
        )

    def run(self, context: AlgorithmContext) -> SFTResult:
        self._trainer: TrainBackend | None = None
        try:
            return self._run(context)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: a step is never cut (fit_sequences); say where it stopped
            step = self._trainer.step if self._trainer is not None else 0
            how = (
                f"its checkpoint is in {self.checkpoint_dir}: the same command resumes from it"
                if self.checkpoint_dir is not None and step > 0
                else "no checkpoint directory (--resume, checkpoint_dir=): a new run starts over"
            )
            context.console.print(f"[yellow]interrupted after SFT step {step}; {how}[/]", soft_wrap=True)
            raise

    def _run(self, context: AlgorithmContext) -> SFTResult:
        from agentgrad.training import Sample, fit_sequences
        from agentgrad.training.backend import export_policy, trainer_for

        publisher = self._publisher(context)
        trainer = self._trainer = trainer_for(context.policy, self.model_dir, self.train_config)
        result = SFTResult([], [], [], [])
        self._validating = bool(context.val_tasks) and self.output_dir is not None
        self.best = (
            BestModel(
                self.output_dir, timeout=self.wait_timeout, rollout_config=self.rollout_config, run=f"sft:{self.run_id}"
            )
            if self.output_dir is not None
            else None
        )
        run_log = RunLog(None, context.store, f"sft:{self.run_id}")  # the store only: no file to close
        if self._validating:
            start = context.store.get_latest_resources()
            self._validate(context, 0, trainer, self._add_resources(context.store, dict(start.items) if start else {}))
        total_steps = self.iterations * self.steps
        report_every = max(1, self.steps // 10)  # about ten lines an iteration: a long run shows it is moving
        for iteration in range(self.iterations):
            if context.train_tasks and self.samples_per_task:
                self._collect(context, iteration)
            transitions, funnel = select_transitions(context.store, self.criteria)
            context.console.print(f"SFT iteration {iteration}: {len(transitions)} sequence(s) — {funnel.describe()}")
            samples = [Sample.from_transition(t) for t in transitions]

            def on_step(step: int, metrics: StepMetrics, n: int = len(samples)) -> None:
                # NaN marks "not measured by an NLL step" (clip fraction, KL…): the run log leaves it out.
                run_log.log(step, {**metrics.as_dict(), "samples": float(n)})
                if step % report_every == 0 or step == total_steps:
                    context.console.print(
                        f"SFT step {step}/{total_steps}  loss {metrics.loss:.3f}  grad norm {metrics.grad_norm:.2f}"
                        f"  {metrics.tokens / max(metrics.seconds, 1e-9):.0f} tok/s"
                    )

            result.history += fit_sequences(
                trainer,
                samples,
                steps=(iteration + 1) * self.steps,
                batch_size=self.batch_size,
                checkpoint_dir=self.checkpoint_dir,
                on_step=on_step,
            )
            published = publisher.publish(trainer)
            greedy_id = self._announce(context.store, published)
            result.funnels.append(funnel)
            result.samples.append(len(samples))
            result.versions.append(published.version)
            context.console.print(f"SFT iteration {iteration}: published {published.version}")
            if self._validating:
                self._validate(context, iteration + 1, trainer, greedy_id)
        if self.best is not None:
            result.validation = self.best.curve
            result.best_iteration, result.best_score = self.best.step, self.best.score
        if self.output_dir is not None:
            result.model = export_policy(trainer, self.output_dir / "model")
            context.console.print(f"SFT: final model {result.model}")
        return result
