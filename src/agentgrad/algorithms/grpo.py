"""GRPO: group-relative policy optimization of an unmodified agent from its captured LLM calls.

Read top to bottom, like a nanoGPT training loop: :class:`GRPOConfig` (every setting, one
docstring each), then :class:`GRPO`, whose :meth:`GRPO.run` sets up (or resumes) in
:meth:`GRPO._start` and then repeats one step:

1. **sample** — ``group_size`` rollouts of each of ``batch_size`` tasks (a group shares a
   ``group_id``), through the store (:meth:`GRPO.submit`, :meth:`GRPO.collect`), with the current
   policy; with ``overlap`` the next step's batch is submitted before this one's update, so the
   runners sample it while the trainer trains;
2. **transitions** — spans → token sequences (credit assignment, agent_match, merging), dropping
   those sampled too many versions ago;
3. **advantages** — rewards compared within each group, by ``estimator`` (GRPO, RLOO,
   REINFORCE++, Dr. GRPO), or each group's best vs worst completion as a DPO pair;
4. **update** — one PPO-clip step (or one DPO step);
5. **publish** — the new weights to the engine, and resources naming them;
6. **evaluate** — greedy validation every ``val_every`` steps, keeping the best model;
7. **log** — ``metrics.jsonl``, the store (for the dashboard), any trackers, the progress bar.

Each stage is a method a test can call alone. At the end the final model is exported to
``output_dir/model`` (and the best-validation one is in ``output_dir/best``): Hugging Face
directories that ``agentgrad serve-model``, transformers and vLLM load.

Failure handling: rollouts that fail (including a non-numeric reward, which the runner turns
into a failed rollout) give no transitions; a step in which *no* rollout gave a transition is
logged and retried with the same tasks (``max_empty_retries`` times), never trained on. A step
whose groups all have identical rewards has no learning signal: it is logged and skipped.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentgrad.adapters import (
    ESTIMATORS,
    AdaptStats,
    CreditRule,
    TransitionAdapter,
    group_advantages,
    preference_pairs,
)
from agentgrad.algorithms.base import Algorithm, AlgorithmContext, is_live
from agentgrad.algorithms.batch import cancel_unfinished, wait_batch
from agentgrad.algorithms.runlog import RunLog, Tracker, read_back
from agentgrad.algorithms.validation import BestModel, with_sampling
from agentgrad.store.protocol import RolloutRequest, Store
from agentgrad.training.interrupts import deferred_interrupts
from agentgrad.training.policy import TrainConfig  # a dataclass: importing it loads no torch
from agentgrad.types import LLM, Resources, Rollout, RolloutConfig, RolloutStatus, Transition

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from agentgrad.training.backend import Publisher, TrainBackend


# ---------------------------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------------------------


@dataclass
class GRPOConfig:
    """Every GRPO setting. A config file sets them by name (``train:`` is a nested section);
    ``GRPO(model_dir, steps=30)`` overrides single ones."""

    steps: int = 20
    """Optimizer steps to run (a resumed run counts those already done)."""
    max_seconds: float | None = None
    """Wall-clock budget in seconds: no new step starts when it would likely overrun (None: no budget)."""
    batch_size: int = 8
    """Tasks per step."""
    group_size: int = 8
    """Rollouts per task in a step; advantages compare the rewards within such a group (≥ 2)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimizer, loss and batching settings of the policy trainer (learning rate, clipping, KL, LoRA…)."""
    mini_batches: int = 1
    """Optimizer updates per epoch: each epoch's transitions are cut into this many parts."""
    epochs: int = 1
    """Passes over a step's transitions. ``epochs`` × ``mini_batches`` updates learn more per rollout,
    which pays when rollouts cost more than training; the importance ratio's clipping keeps the
    later, off-policy updates safe (1 × 1: one on-policy update)."""
    estimator: Literal["grpo", "rloo", "reinforce++", "dr_grpo", "dpo"] = "grpo"
    """What a step learns from its groups (docs/algorithms.md): ``grpo`` ``(r - mean) / std`` per group;
    ``rloo`` ``r`` minus the mean of the group's other members; ``reinforce++`` ``r - mean`` scaled by the
    whole batch's std; ``dr_grpo`` ``r - mean``, and the loss divided by a constant (``sampling.max_tokens``,
    else the model's context) per sequence instead of the step's token count; ``dpo`` no advantages: the
    DPO loss on each group's best vs worst completion (``dpo_beta``), reference = the start weights."""
    dpo_beta: float = 0.1
    """DPO's β (``estimator: dpo``): how far, in log-ratio to the start policy, a pair may be pulled apart."""
    normalize: Literal["std", "mean"] | None = None
    """Deprecated, use ``estimator``: ``std`` is ``estimator: grpo``, ``mean`` is ``estimator: dr_grpo``."""
    agreeing_groups: Literal["drop", "regularize"] = "drop"
    """Groups whose rewards all agree (no advantage): ``drop`` leaves them out of the update;
    ``regularize`` keeps them with advantage 0, so that only the KL penalty (``train.kl_coef``) and the
    entropy bonus act on them. A policy that has become sure of a wrong answer fails a whole group,
    which then carries no signal: only a regulariser that also sees those groups pulls it back
    (docs/training.md, "Stability"). Their tokens count in the token mean, so a step with little
    signal makes a smaller update."""
    max_staleness: int = 0
    """Drop transitions sampled more than this many published versions ago (0: only the current one)."""
    overlap: bool = False
    """Sample the next step's batch while the trainer updates on this one, with the weights the
    engine serves meanwhile (published one step before; the engine switches to the new ones as
    they are published, mid-rollout). Runners and trainer then rarely wait for each other, at the
    price of samples one version old: needs ``max_staleness`` ≥ 1, and ``train.tis_cap`` corrects
    for the older sampler (docs/algorithms.md, "Overlap")."""
    credit: str | CreditRule = "final"
    """How a rollout's reward is assigned to its LLM calls: ``final``, ``discounted`` (``discounted:0.8``),
    ``emitted``, ``air`` (see docs/credit-assignment.md), or a CreditRule object."""
    agent_match: str | None = None
    """Regular expression searched in agent names: train only on the calls of matching agents (``write|rewrite``);
    calls without an agent name never match (None: train on every call)."""
    merge: bool = True
    """Merge consecutive calls whose prompt extends the previous prompt + completion into one sequence."""
    sampling: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0})
    """Sampling settings put in the LLM resource for training rollouts, over ``temperature: 1.0``
    (validation always samples greedily)."""
    rollout_timeout_seconds: float | None = 300.0
    """Seconds one attempt of a rollout may run before the store times it out (None: no limit)."""
    max_attempts: int = 1
    """Attempts per rollout, the first included (1: a failed rollout is not retried)."""
    batch_timeout: float = 600.0
    """Seconds a step (or a validation) waits for its rollouts; the ones still running then are
    cancelled and count as failed."""
    max_empty_retries: int = 3
    """Steps in a row that may give no transition at all (every rollout failed or captured no usable
    LLM call) before the run stops with an error."""
    val_every: int = 5
    """Greedy validation every this many steps (0: only before the first step and after the last).
    A new best score exports the model to ``output_dir/best``."""
    output_dir: str | Path = "runs/grpo"
    """Where ``metrics.jsonl``, ``checkpoints/``, the best (``best/``) and final (``model/``) models go."""
    checkpoint_every: int = 5
    """Save a checkpoint every this many steps (and after the last)."""
    resume: bool = True
    """Continue from the latest checkpoint in ``output_dir`` when there is one."""
    run_id: str = "grpo"
    """Names the run's metrics in the store and its rollout groups."""
    seed: int = 0
    """Seed of the task order (the same order on every run and after a resume)."""

    def __post_init__(self) -> None:
        positive = {
            "batch_size": self.batch_size,
            "mini_batches": self.mini_batches,
            "epochs": self.epochs,
            "checkpoint_every": self.checkpoint_every,
            "max_attempts": self.max_attempts,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"GRPOConfig.{name} must be ≥ 1, got {value!r}")
        if self.group_size < 2:
            raise ValueError(
                f"GRPOConfig.group_size must be ≥ 2 (a group needs two samples to compare), got {self.group_size!r}"
            )
        for name, value in {
            "steps": self.steps,
            "val_every": self.val_every,
            "max_staleness": self.max_staleness,
            "max_empty_retries": self.max_empty_retries,
        }.items():
            if value < 0:
                raise ValueError(f"GRPOConfig.{name} must be ≥ 0, got {value!r}")
        self._fold_normalize()
        if self.estimator not in ESTIMATORS + ("dpo",):
            raise ValueError(
                f"GRPOConfig.estimator must be one of {', '.join(map(repr, ESTIMATORS + ('dpo',)))}, "
                f"got {self.estimator!r}"
            )
        if not self.dpo_beta > 0:
            raise ValueError(f"GRPOConfig.dpo_beta must be > 0, got {self.dpo_beta!r}")
        if self.agreeing_groups not in ("drop", "regularize"):
            raise ValueError(f"GRPOConfig.agreeing_groups must be 'drop' or 'regularize', got {self.agreeing_groups!r}")
        if self.overlap and self.max_staleness < 1:
            raise ValueError(
                "GRPOConfig.overlap samples with the weights of the step before: it needs max_staleness ≥ 1 "
                f"(got {self.max_staleness}), or its samples would all be dropped as stale"
            )
        if self.agreeing_groups == "regularize" and not (self.train.kl_coef > 0 or self.train.entropy_coef > 0):
            raise ValueError(
                "GRPOConfig.agreeing_groups='regularize' needs a regulariser to act on those groups: "
                "set train.kl_coef or train.entropy_coef > 0"
            )

    def _fold_normalize(self) -> None:
        """The deprecated ``normalize`` becomes the ``estimator`` it names (then None, so a copy
        of this config does not warn again)."""
        if self.normalize is None:
            return
        named = {"std": "grpo", "mean": "dr_grpo"}.get(self.normalize)
        if named is None:
            raise ValueError(
                f"GRPOConfig.normalize must be 'std' or 'mean' (deprecated: use estimator), got {self.normalize!r}"
            )
        if self.estimator not in ("grpo", named):
            raise ValueError(
                f"GRPOConfig.normalize={self.normalize!r} (deprecated) contradicts "
                f"estimator={self.estimator!r}: set estimator alone"
            )
        warnings.warn(
            f"GRPOConfig.normalize={self.normalize!r} is deprecated: use estimator={named!r}"
            + (
                " (which also divides the loss by a constant instead of the step's token count)"
                if named == "dr_grpo"
                else ""
            ),
            DeprecationWarning,
            stacklevel=4,
        )
        self.estimator, self.normalize = named, None  # type: ignore[assignment]


#: Keywords of the GRPO of before GRPOConfig, and what replaced them (named in the TypeError).
_RENAMED = {
    "train_config": "train",
    "rollout_config": "rollout_timeout_seconds and max_attempts",
    "rollout_timeout": "batch_timeout",
}


@dataclass
class GRPOResult:
    """What ``fit()`` returns: per-step metrics, the validation curve and the best model."""

    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    #: (step, greedy validation reward mean) — step 0 is before any update.
    validation: list[tuple[int, float]] = field(default_factory=list)
    output_dir: Path | None = None
    #: The step and validation score of the best model (exported to ``output_dir/best``).
    best_step: int | None = None
    best_score: float | None = None


@dataclass
class PendingBatch:
    """A step's rollouts, enqueued and not yet collected."""

    rollout_ids: list[str]
    #: ``time.monotonic()`` at the submission
    submitted: float
    step: int


# ---------------------------------------------------------------------------------------------
# the algorithm
# ---------------------------------------------------------------------------------------------


class GRPO(Algorithm):
    """GRPO over the captured calls of any agent.

    Args:
        model_dir: the policy's Hugging Face model directory (the one the engine serves).
        config: every setting (:class:`GRPOConfig`); default: its defaults.
        publisher: how new weights reach the engine; default: ``context.policy.publisher()``
            (``Trainer(policy=LocalPolicy(model_dir))``).
        trackers: experiment trackers that receive every logged step, besides ``metrics.jsonl``
            and the store (:mod:`agentgrad.algorithms.trackers`).
        on_step: called with each step's metrics (after logging).
        **overrides: :class:`GRPOConfig` fields, set over ``config``: ``GRPO(model_dir, steps=30)``.
    """

    def __init__(
        self,
        model_dir: str | Path,
        config: GRPOConfig | None = None,
        *,
        publisher: Publisher | None = None,
        trackers: Sequence[Tracker] = (),
        on_step: Callable[[dict[str, float]], None] | None = None,
        **overrides: Any,
    ) -> None:
        self.config = config = _with_overrides(config or GRPOConfig(), overrides)
        self.model_dir = Path(model_dir)
        self.output_dir = Path(config.output_dir)
        self.checkpoint_dir = self.output_dir / "checkpoints"
        self.publisher, self.trackers, self.on_step = publisher, list(trackers), on_step
        self.adapter = TransitionAdapter(config.credit, agent_match=config.agent_match, merge=config.merge)
        self.sampling = {"temperature": 1.0, **config.sampling}
        self.rollout_config = RolloutConfig(
            timeout_seconds=config.rollout_timeout_seconds, max_attempts=config.max_attempts
        )
        #: Every version the engine has served in this run, oldest first (for staleness).
        self.versions: list[str] = []
        # What _start() sets up for a run.
        self.store: Store
        self.console: Any = None
        self.tasks: list[Any] = []
        self.val_tasks: list[Any] = []
        self.trainer: TrainBackend
        self.weights_publisher: Publisher
        self.base_items: dict[str, Any] = {}
        self.model_name: str | None = None
        self.train_resources: Resources
        self.val_resources: Resources
        self.cursor = 0
        self.result = GRPOResult(steps=0, output_dir=self.output_dir)
        self.best = BestModel(
            self.output_dir, timeout=config.batch_timeout, rollout_config=self.rollout_config, run=config.run_id
        )
        self.run_log: RunLog | None = None
        #: What the adapter did with the last batch (an empty batch names what agent_match left out).
        self.adapt_stats = AdaptStats()
        self.progress: tuple[Progress, TaskID] | None = None
        #: Runner idle time not yet logged, and since when (wall clock) no training batch has run.
        self._runner_idle = 0.0
        self._runners_idle_since: float | None = None
        #: Whether the run has said what a step of identical rewards everywhere means (once a run).
        self._said_no_variance = False
        #: Whether a step of this run has updated the weights (what identical rewards then mean differs).
        self._has_trained = False
        #: The step of the last checkpoint saved (or resumed from); -1: none yet.
        self._checkpointed_step = -1

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self, context: AlgorithmContext) -> GRPOResult:
        from agentgrad.training.policy import cursor_batches

        cfg = self._start(context)
        trainer, store = self.trainer, self.store
        batches = cursor_batches(len(self.tasks), cfg.batch_size, self.cursor, cfg.seed)
        indices, next_cursor = next(batches)
        started, last_step_seconds, empty_retries = time.monotonic(), 0.0, 0
        pending: PendingBatch | None = None  # a batch under way: enqueued, not yet collected
        with RunLog(self.output_dir, store, cfg.run_id, self.trackers) as self.run_log, self._progress():
            try:
                if trainer.step == 0 and (validation := self.evaluate(0)):
                    self.run_log.log(0, validation)
                while trainer.step < cfg.steps and not self._out_of_time(started, last_step_seconds):
                    step, step_started = trainer.step + 1, time.monotonic()
                    # ---- sample: group_size rollouts of each task of the batch (under way already
                    # when the previous step overlapped), with the policy the engine serves
                    if pending is None:
                        pending = self.submit(indices, step, attempt=empty_retries)
                    rollouts = self.collect(pending)
                    values = rollout_metrics(rollouts, time.monotonic() - pending.submitted)
                    values["trainer_wait_seconds"] = time.monotonic() - step_started
                    pending = None
                    # ---- transitions: spans → token sequences with credit; too-stale ones dropped
                    transitions, adapted = self.transitions(store, rollouts)
                    values.update(adapted)
                    if not transitions:  # nothing usable: logged and retried with the same tasks, never trained on
                        empty_retries = self._empty_batch(step, values, empty_retries)
                        continue
                    empty_retries = 0
                    # ---- advantages: rewards normalized within each group; groups that all agree drop out
                    kept, grouped = self.advantages(transitions)
                    values.update(grouped)
                    # An interrupt waits for the step's weights, cursor and checkpoint to agree.
                    with deferred_interrupts():
                        self.cursor = next_cursor
                        indices, next_cursor = next(batches)
                        # ---- overlap: the next batch samples while this one trains
                        if self._overlaps(step):
                            pending = self.submit(indices, step + 1)
                        self._train_step(step, kept, values)
                    last_step_seconds = self._end_step(values, step_started)
                if pending is not None:  # out of time with a batch under way: not to be trained on
                    self.cancel(pending)
                    pending = None
                self._checkpoint_unless_saved()  # out of time before the last step: keep the one reached
                if validation := self.evaluate(trainer.step):
                    self.run_log.log(trainer.step, validation)
            except KeyboardInterrupt:
                self._stop_interrupted()
                raise
            finally:
                if pending is not None:  # an error or an interrupt: nobody will train on it
                    self.cancel(pending)
        return self._finish()

    def _stop_interrupted(self) -> None:
        """Ctrl-C or SIGTERM: keep the last whole step as a checkpoint and say how to go on."""
        step = self.trainer.step
        with deferred_interrupts():
            self._checkpoint_unless_saved()
        if step == 0:
            self.console.print("[yellow]interrupted before its first step[/]")
            return
        how = "the same command resumes from it" if self.config.resume else "run it again with --resume to go on"
        self.console.print(
            f"[yellow]interrupted after step {step} of {self.config.steps}; its checkpoint is in "
            f"{self.checkpoint_dir}: {how}[/]",
            soft_wrap=True,
        )

    def _train_step(self, step: int, kept: list[Transition], values: dict[str, float]) -> None:
        """Update and publish (or skip a step with nothing to learn from), and checkpoint when due."""
        cfg, trainer = self.config, self.trainer
        train_started = time.monotonic()
        if kept:
            # ---- update: one PPO-clip step (epochs × mini_batches optimizer updates)
            values.update(self.update(kept))
            self._has_trained = True
            # ---- publish: the new weights to the engine, then resources naming them
            self.publish()
        else:  # every group had identical rewards: nothing to learn from, move on
            trainer.skip_step()
            self.console.print(
                f"[yellow]step {step}: all {int(values['grpo/groups'])} groups had zero reward variance "
                f"(reward mean {values.get('reward/mean', 0.0):.2f}) — skipped[/]"
            )
            if not self._said_no_variance and values.get("reward/std", 0.0) == 0.0:
                self._said_no_variance = True  # once: the hint does not change from step to step
                self.console.print(f"[yellow]  {no_variance_hint(self._has_trained)}[/]")
        values["train_seconds"] = time.monotonic() - train_started
        if trainer.step % cfg.checkpoint_every == 0 or trainer.step >= cfg.steps:
            self.checkpoint()

    def _end_step(self, values: dict[str, float], step_started: float) -> float:
        """Show the step just trained, validate when due and log the step; return its seconds."""
        trainer = self.trainer
        self.show(trainer.step, values)  # before the validation's lines, which come after the step
        # ---- evaluate: greedy validation every val_every steps (the last step's comes after the loop)
        if self._validates_after(trainer.step):
            values.update(self.evaluate(trainer.step))
        values.update(step_timing(values, time.monotonic() - step_started, self._take_runner_idle()))
        # ---- log: metrics.jsonl, the store, trackers, on_step
        self.log(trainer.step, values)
        return values["step_seconds"]

    def _validates_after(self, step: int) -> bool:
        """Whether greedy validation runs after ``step`` inside the loop (the last one's comes after it)."""
        return bool(self.config.val_every) and step % self.config.val_every == 0 and step < self.config.steps

    def _overlaps(self, step: int) -> bool:
        """Whether the next batch starts now, while ``step`` trains: with ``overlap``, when there
        is a next step. A validation after ``step`` still sees only its weights: the engine gets
        newer ones only once the trainer, which waits for the validation, has trained on the
        next batch."""
        return self.config.overlap and step < self.config.steps

    # ---- setup and the end -------------------------------------------------------------------------
    def _start(self, context: AlgorithmContext) -> GRPOConfig:
        """Read the context, load the policy (from the latest checkpoint when resuming), make sure
        the engine serves those weights, and publish the first resources."""
        from agentgrad.training.backend import trainer_for

        cfg = self.config
        self.store, self.console = context.store, context.console
        self.tasks, self.val_tasks = list(context.train_tasks), list(context.val_tasks)
        if not self.tasks:
            raise ValueError("GRPO needs train_tasks")
        self.base_items = self._base_items(context)
        self.weights_publisher = self._publisher(context)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.trainer = trainer_for(context.policy, self.model_dir, cfg.train)
        self.trainer.total_steps = cfg.steps  # the horizon of train.lr_decay
        if cfg.train.tis_cap is not None and not hasattr(self.trainer, "with_proximal_logprobs"):
            raise ValueError(
                f"train.tis_cap needs the trainer's own logprobs before each step; {type(self.trainer).__name__} "
                "does not compute them (use the local PolicyTrainer, or leave tis_cap unset)"
            )
        state = self.trainer.load_checkpoint(self.checkpoint_dir) if cfg.resume else None
        self.cursor = int(state["cursor"]) if state else 0
        self.versions, self.model_name = [], None
        self.result = GRPOResult(steps=self.trainer.step, output_dir=self.output_dir)
        if state:  # the engine must serve the checkpoint's weights, not the initial ones
            # whether the steps before the checkpoint updated the weights (older checkpoints do not
            # say: a step done before is the likelier case)
            self._has_trained = bool((state.get("extra") or {}).get("trained", self.trainer.step > 0))
            self.publish()
            logged = read_back(self.output_dir, self.trainer.step)
            self.best.load(logged)
            rows = {r["step"]: r for r in logged if "reward/mean" in r}  # steps, not validations; the last try of each
            self.result.history = [rows[step] for step in sorted(rows)]
            self._checkpointed_step = self.trainer.step
            self._sync_best()
            self.console.print(f"[bold]resumed[/] from step {self.trainer.step} (task cursor {self.cursor})")
        else:
            self.versions.append(context.policy.model_version if context.policy is not None else "v0")
            self._publish_resources()
        return cfg

    def _finish(self) -> GRPOResult:
        """Export the final model next to the best one; return the result."""
        self.result.steps = self.trainer.step
        self.console.print(f"final model: [bold]{self._export('model')}[/]")
        return self.result

    def _base_items(self, context: AlgorithmContext) -> dict[str, Any]:
        base = dict(context.initial_resources or {})
        if not base:
            latest = context.store.get_latest_resources()
            base = dict(latest.items) if latest else {}
        if not any(isinstance(v, LLM) for v in base.values()):
            raise ValueError("GRPO needs an LLM resource (Trainer.fit(..., resources={'llm': LLM(...)}))")
        return base

    def _publisher(self, context: AlgorithmContext) -> Publisher:
        if self.publisher is not None:
            return self.publisher
        if context.policy is not None:
            return context.policy.publisher()
        raise ValueError(
            "GRPO needs somewhere to publish its new weights: Trainer(policy=LocalPolicy(model_dir)) "
            "or GRPO(..., publisher=...)"
        )

    # ---- 1. sample ---------------------------------------------------------------------------------
    def submit(self, indices: Sequence[int], step: int, *, attempt: int = 0) -> PendingBatch:
        """Enqueue ``group_size`` rollouts of each task of ``indices`` with the current training
        resources; a group's rollouts share a ``group_id`` (step, task index and ``attempt``: a
        retried step's groups are new ones). Runners start on them at once."""
        cfg = self.config
        requests = [
            RolloutRequest(
                input=self.tasks[i],
                mode="train",
                resources_id=self.train_resources.resources_id,
                config=self.rollout_config,
                metadata={"group_id": f"{cfg.run_id}-s{step}-t{i}-r{attempt}", "step": step},
            )
            for i in indices
            for _ in range(cfg.group_size)
        ]
        ids = [r.rollout_id for r in self.store.enqueue_rollouts(requests)]
        if self._runners_idle_since is not None:
            self._runner_idle += max(0.0, time.time() - self._runners_idle_since)
            self._runners_idle_since = None
        return PendingBatch(ids, time.monotonic(), step)

    def collect(self, pending: PendingBatch) -> list[Rollout]:
        """Wait for a submitted batch. A step cannot wait forever for one stuck agent: rollouts
        still running after ``batch_timeout`` are cancelled and count as failed."""
        rollouts = wait_batch(
            self.store,
            pending.rollout_ids,
            timeout=self.config.batch_timeout,
            on_straggler="cancel",
            label=f"GRPO step {pending.step}",
        ).rollouts
        ends = [r.end_time for r in rollouts if r.end_time is not None]
        self._runners_idle_since = max(ends) if ends else time.time()
        return rollouts

    def cancel(self, pending: PendingBatch) -> None:
        """Give up a submitted batch (the run stops before training on it)."""
        cancelled = cancel_unfinished(self.store, pending.rollout_ids)
        if cancelled:
            self.console.print(f"cancelled {cancelled} rollout(s) of step {pending.step}, which will not be trained")

    def _take_runner_idle(self) -> float:
        """Seconds the runners had no training batch since the last call (between a batch's last
        rollout and the next batch's submission)."""
        idle, self._runner_idle = self._runner_idle, 0.0
        return idle

    # ---- 2. transitions -----------------------------------------------------------------------------
    def transitions(self, store: Store, rollouts: Sequence[Rollout]) -> tuple[list[Transition], dict[str, float]]:
        """The rollouts' spans as transitions (the adapter: credit, agent_match, merging), without
        those sampled more than ``max_staleness`` versions ago; with the adapter's counts."""
        transitions, stats = self.adapter.adapt(store, rollouts)
        self.adapt_stats = stats
        kept, stale, unknown = self._staleness_filter(transitions)
        return kept, {**stats.as_metrics(), "stale_transitions": stale, "unknown_version_transitions": unknown}

    def _staleness_filter(self, transitions: list[Transition]) -> tuple[list[Transition], int, int]:
        """Drop transitions sampled more than ``max_staleness`` versions ago (oldest version of a
        merged sequence counts); unknown versions are kept and counted."""
        current = len(self.versions) - 1
        kept, stale, unknown = [], 0, 0
        for t in transitions:
            versions = [v for v in t.metadata.get("model_versions", [t.model_version]) if v is not None]
            known = [self.versions.index(v) for v in versions if v in self.versions]
            if not known:
                unknown += 1
                kept.append(t)
            elif current - min(known) > self.config.max_staleness:
                stale += 1
            else:
                kept.append(t)
        return kept, stale, unknown

    def _empty_batch(self, step: int, values: dict[str, float], retries: int) -> int:
        """Log a step that gave no transition; stop the run after ``max_empty_retries`` in a row."""
        retries += 1
        failed, total = int(values["rollouts_failed"]), int(values["rollouts"])
        filtered = self._filtered_out()
        self.console.print(
            f"[yellow]step {step}: empty batch ({failed}/{total} rollouts failed, "
            f"{int(values['adapter/rollouts_without_calls'])} without LLM calls{filtered}) — not "
            f"trained on; retry {retries}/{self.config.max_empty_retries}[/]"
        )
        assert self.run_log is not None
        self.run_log.log(step, {"empty_batch": 1.0, "rollouts_failed": failed})
        if retries > self.config.max_empty_retries:
            raise RuntimeError(
                f"{retries} empty batches in a row: every rollout failed or gave no usable LLM "
                f"call{filtered}; see the dashboard or `agentgrad dev`"
            )
        return retries

    def _filtered_out(self) -> str:
        """``agent_match`` and the agent names of the calls it left out, when it left any out."""
        stats = self.adapt_stats
        if self.adapter.agent_match is None or not stats.calls_other_agents:
            return ""
        return (
            f"; agent_match {self.adapter.agent_match.pattern!r} left out {stats.calls_other_agents} call(s) "
            f"of agents {sorted(stats.other_agents)}"
        )

    # ---- 3. advantages ----------------------------------------------------------------------------
    def advantages(self, transitions: Sequence[Transition]) -> tuple[list[Transition], dict[str, float]]:
        """Advantages by ``estimator``; groups whose rewards all agree carry no signal and are
        dropped. Returns the transitions to train on and the group counts. With ``dpo`` the
        transitions are each group's (best, worst) pair, flattened: chosen, rejected, chosen, …"""
        if self.config.estimator == "dpo":
            pairs, paired = preference_pairs(transitions)
            return [t for pair in pairs for t in pair], {**paired.as_metrics(), "dpo/pairs": len(pairs)}
        kept, stats = group_advantages(transitions, self.config.estimator)
        metrics = {**stats.as_metrics(), **signal_share(transitions, kept)}
        if self.config.agreeing_groups == "regularize":  # back in with advantage 0: only the regularisers act
            signal = {id(t) for t in kept}
            agreeing = [t for t in transitions if id(t) not in signal]
            for t in agreeing:
                t.advantage = 0.0
            kept = [*kept, *agreeing]
        return kept, metrics

    # ---- 4. update --------------------------------------------------------------------------------
    def update(self, transitions: Sequence[Transition]) -> dict[str, float]:
        """One PPO-clip training step of the policy on ``transitions`` (advantages set), or with
        ``estimator: dpo`` one DPO step on the pairs :meth:`advantages` laid out."""
        from agentgrad.training.policy import Sample

        samples = [Sample.from_transition(t) for t in transitions]
        if self.config.estimator == "dpo":
            return self._dpo_update(samples)
        metrics = self.trainer.ppo_step(
            samples,
            mini_batches=self.config.mini_batches,
            epochs=self.config.epochs,
            tokens_per_sample=self._tokens_per_sample(),
        )
        return {
            "loss": metrics.loss,
            "entropy": metrics.entropy,
            "kl": metrics.kl,
            "clip_fraction": metrics.clip_fraction,
            "grad_norm": metrics.grad_norm,
            "updates": metrics.updates,
            "tokens": metrics.tokens,
            "tokens_per_second": metrics.tokens_per_second,
            "ratio_mean": metrics.ratio_mean,
            "ratio_max": metrics.ratio_max,
            "lr": metrics.lr,
            **(
                {
                    "tis/weight": metrics.tis_weight,
                    "tis/capped": metrics.tis_capped,
                    "tis/logprob_gap": metrics.logprob_gap,
                }
                if self.config.train.tis_cap is not None
                else {}
            ),
        }

    def _tokens_per_sample(self) -> float | None:
        """Dr. GRPO's constant loss normaliser per sequence: the generation budget
        (``sampling.max_tokens``), else the model's context; None (token count) for the others."""
        if self.config.estimator != "dr_grpo":
            return None
        budget = self.sampling.get("max_tokens") or self.trainer.context_length
        if not budget:
            raise ValueError("estimator 'dr_grpo' needs a generation budget: set sampling.max_tokens")
        return float(budget)

    def _dpo_update(self, samples: list[Any]) -> dict[str, float]:
        """One DPO step on (chosen, rejected) pairs, consecutive in ``samples``."""
        from agentgrad.training.dpo import dpo_step
        from agentgrad.training.policy import PolicyTrainer

        if not isinstance(self.trainer, PolicyTrainer):
            raise ValueError(
                f"estimator 'dpo' needs the local PolicyTrainer (it runs the start policy for DPO's "
                f"reference); {type(self.trainer).__name__} has no DPO step"
            )
        dpo = dpo_step(self.trainer, list(zip(samples[0::2], samples[1::2], strict=True)), beta=self.config.dpo_beta)
        m = dpo.step
        return {
            "loss": m.loss,
            "entropy": m.entropy,
            "kl": m.kl,
            "clip_fraction": 0.0,
            "grad_norm": m.grad_norm,
            "updates": m.updates,
            "tokens": m.tokens,
            "tokens_per_second": m.tokens_per_second,
            "lr": m.lr,
            "dpo/margin": dpo.margin,
            "dpo/accuracy": dpo.accuracy,
        }

    # ---- 5. publish -------------------------------------------------------------------------------
    def publish(self) -> None:
        """Make the engine serve the trainer's weights (a new version), then publish resources
        naming that version, so every rollout records the policy it ran on."""
        published = self.weights_publisher.publish(self.trainer)
        self.versions.append(published.version)
        self.model_name = published.model or self.model_name
        self._publish_resources()

    def _publish_resources(self) -> None:
        """The training (sampling) and validation (greedy) resources of the current version."""
        self.train_resources = self._resources(self.sampling, "train")
        self.val_resources = self._resources({"temperature": 0.0}, "val")

    def _resources(self, sampling: dict[str, Any], purpose: str) -> Resources:
        items = with_sampling(self.base_items, sampling, self.model_name)
        items["agentgrad_policy"] = {"model_version": self.versions[-1], "purpose": purpose}
        return self.store.add_resources(items)

    def checkpoint(self) -> None:
        """Save the trainer (weights, optimizer, step), the task cursor and whether a step has
        updated the weights (what identical rewards mean after a resume) under ``checkpoints/``."""
        extra = {"version": self.versions[-1], "trained": self._has_trained}
        self.trainer.save_checkpoint(self.checkpoint_dir, cursor=self.cursor, extra=extra)
        self._checkpointed_step = self.trainer.step

    def _checkpoint_unless_saved(self) -> None:
        """A checkpoint of the step reached, unless one was saved (or resumed from) at it already."""
        if self.trainer.step > 0 and self._checkpointed_step != self.trainer.step:
            self.checkpoint()

    # ---- 6. evaluate ------------------------------------------------------------------------------
    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy validation on the val tasks (none: nothing, ``{}``). A new best score exports
        the current model to ``output_dir/best``. Returns the validation metrics."""
        if not self.val_tasks:
            return {}
        values = self.best.validate(
            self.store,
            self.val_tasks,
            step,
            self.trainer,
            resources_id=self.val_resources.resources_id,
            console=self.console,
        )
        self._sync_best()
        return values

    def _sync_best(self) -> None:
        self.result.validation = list(self.best.curve)
        self.result.best_step, self.result.best_score = self.best.step, self.best.score

    def _export(self, name: str) -> Path:
        """The trainer's current model as a Hugging Face directory ``output_dir/name``."""
        from agentgrad.training.backend import export_policy

        return export_policy(self.trainer, self.output_dir / name)

    # ---- 7. log -----------------------------------------------------------------------------------
    def log(self, step: int, values: dict[str, float]) -> None:
        """Record a step's metrics in every sink and the result's history; then call ``on_step``."""
        assert self.run_log is not None
        self.run_log.log(step, values)
        self.result.history.append({"step": step, **values})
        if self.on_step is not None:
            self.on_step(values)

    def show(self, step: int, values: dict[str, float]) -> None:
        """A trained step's numbers on the progress bar, or where there is none one whole line."""
        update = (
            f"entropy {values['entropy']:.2f}  clip {values['clip_fraction']:.2f}  "
            f"{values['tokens_per_second']:.0f} tok/s"
            if "loss" in values
            else "no update (no reward variance)"
        )
        line = (
            f"reward {values['reward/mean']:.2f}  success {values['success']:.2f}  "
            f"{update}  {values['rollouts_per_second']:.1f} ro/s"
        )
        if self.progress is not None:
            progress, bar = self.progress
            progress.update(bar, completed=step, description=line)
        else:  # no live bar (a log file): one whole line a step, not a bar cut to 80 columns
            self.console.print(f"GRPO step {step}/{self.config.steps}  {line}", soft_wrap=True, highlight=False)

    @contextmanager
    def _progress(self) -> Iterator[None]:
        """A live progress bar where the console shows one; elsewhere (output to a file or pipe)
        :meth:`show` prints a line per step instead."""
        if not is_live(self.console):
            yield
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(
            TextColumn("[bold]GRPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            transient=False,
        )
        with progress:
            self.progress = progress, progress.add_task("", total=self.config.steps, completed=self.trainer.step)
            try:
                yield
            finally:
                self.progress = None

    def _out_of_time(self, started: float, last_step_seconds: float) -> bool:
        """Whether the next step would likely overrun ``max_seconds``."""
        elapsed = time.monotonic() - started
        if self.config.max_seconds is not None and elapsed + last_step_seconds > self.config.max_seconds:
            self.console.print(f"time budget reached after {elapsed:.0f}s")
            return True
        return False


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def _with_overrides(config: GRPOConfig, overrides: dict[str, Any]) -> GRPOConfig:
    """``config`` with some fields replaced; an unknown name is a TypeError naming the valid ones."""
    valid = [f.name for f in dataclasses.fields(GRPOConfig)]
    unknown = [name for name in overrides if name not in valid]
    if unknown:
        hints = "".join(f"; {name!r} is now {_RENAMED[name]!r}" for name in unknown if name in _RENAMED)
        raise TypeError(
            f"GRPO got unknown setting(s) {', '.join(map(repr, unknown))}{hints}. "
            f"Valid GRPOConfig fields: {', '.join(valid)}"
        )
    return dataclasses.replace(config, **overrides) if overrides else config


def rollout_metrics(rollouts: Sequence[Rollout], seconds: float) -> dict[str, float]:
    """Rewards, success and throughput of a step's rollouts (a failed rollout counts as 0)."""
    rewards = [r.reward for r in rollouts if r.reward is not None]
    failed = sum(r.status != RolloutStatus.SUCCEEDED for r in rollouts)
    return {
        "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "success": sum((r or 0.0) > 0 for r in rewards) / max(1, len(rollouts)),
        "rollouts": len(rollouts),
        "rollouts_failed": failed,
        "rollouts_per_second": len(rollouts) / max(seconds, 1e-9),
        "rollout_seconds": seconds,
    }


def signal_share(transitions: Sequence[Transition], kept: Sequence[Transition]) -> dict[str, float]:
    """How much of a step carries a learning signal: the share of its response tokens in groups
    whose rewards all agree (dropped: zero advantage), and the largest advantage magnitude among
    those kept. When few groups disagree, the few tokens left decide the whole update (the
    token-mean loss does not shrink with them), which is where a run starts to drift."""

    def tokens(ts: Sequence[Transition]) -> int:
        return sum(sum(t.response_mask or [1] * len(t.response_ids)) for t in ts)

    total = tokens(transitions)
    return {
        "grpo/zero_advantage_token_share": 1.0 - tokens(kept) / total if total else 0.0,
        "grpo/advantage_abs_max": max((abs(t.advantage) for t in kept), default=0.0),
    }


def step_timing(values: dict[str, float], step_seconds: float, runner_idle_seconds: float) -> dict[str, float]:
    """Where a step's time went: the trainer idles while it waits for rollouts (its batch's, or a
    validation's), the runners while no training batch is queued (in the synchronous loop, while
    it trains and validates)."""
    waited = values["trainer_wait_seconds"] + values.get("val/seconds", 0.0)
    return {
        "step_seconds": step_seconds,
        "trainer_idle_fraction": min(1.0, waited / step_seconds),
        "runner_idle_fraction": min(1.0, runner_idle_seconds / step_seconds),
    }


def no_variance_hint(has_trained: bool) -> str:
    """What a step whose rollouts all scored the same means: before any update, that the model
    never (or always) succeeds on the tasks; after updates, that the policy has settled — on the
    tasks' best score (learned) or on a wrong answer — and further steps on them teach nothing."""
    if not has_trained:
        return (
            "every rollout of the step scored the same: the model never (or always) succeeds on these tasks, "
            "so GRPO has no sample better than another to learn from. Check what the agent does with "
            "`agentgrad dev AGENT --model MODEL --tasks FILE` (dev() in Python), and choose tasks or a model it "
            "succeeds on sometimes"
        )
    return (
        "every rollout of the step scored the same, after steps that trained: the policy now does these tasks "
        "the same way every time. If that is their best score it has learned them, and more steps on them teach "
        "nothing (stop here, or add harder tasks); if not, it has settled on a wrong answer "
        '(docs/training.md, "Stability")'
    )
