"""GRPO: group-relative policy optimization of an unmodified agent from its captured LLM calls.

One step: enqueue ``group_size`` rollouts of each of ``batch_size`` tasks (a group shares a
``group_id``) → wait → adapt spans into transitions (credit assignment, agent_match, merging) →
group-normalized advantages → one PPO-clip optimizer step → publish the new weights to the
engine and new resources naming them → (every ``val_every`` steps) greedy validation → metrics to
the console, ``metrics.jsonl`` and the store (for the dashboard).

Failure handling: rollouts that fail (including a non-numeric reward, which the runner turns
into a failed rollout) give no transitions; a step in which *no* rollout gave a transition is
logged and retried with the same tasks (``max_empty_retries`` times), never trained on. A step
whose groups all have identical rewards has no learning signal: it is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentgrad.adapters import CreditRule, TransitionAdapter, group_advantages
from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.algorithms.baseline import Evaluate
from agentgrad.algorithms.batch import run_batch
from agentgrad.store.protocol import RolloutRequest, Store
from agentgrad.types import LLM, MetricRecord, Resources, RolloutConfig, RolloutStatus, Transition

log = logging.getLogger(__name__)


@dataclass
class GRPOResult:
    """What ``fit()`` returns: per-step metrics and the validation curve."""

    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    #: (step, greedy validation reward mean) — step 0 is before any update.
    validation: list[tuple[int, float]] = field(default_factory=list)
    output_dir: Path | None = None


class GRPO(Algorithm):
    """GRPO over the captured calls of any agent.

    Args:
        model_dir: the policy's Hugging Face model directory (the one the engine serves).
        steps: optimizer steps to run (a resumed run counts those already done).
        max_seconds: wall-clock budget; no new step starts when it would likely overrun.
        batch_size: tasks per step; group_size: rollouts per task.
        train_config: optimizer/loss settings (:class:`agentgrad.training.TrainConfig`).
        credit, agent_match, merge: see :class:`agentgrad.adapters.TransitionAdapter`.
        normalize: ``std`` (``(r-mean)/std``) or ``mean`` (``r-mean``) group advantages.
        max_staleness: drop transitions sampled more than this many published versions ago.
        mini_batches, epochs: optimizer updates per step — ``epochs`` passes over the step's
            transitions, each cut into ``mini_batches`` parts (1 × 1: one on-policy update).
            More updates learn more per rollout, which pays when rollouts cost more than
            training; the importance ratio's clipping keeps the later, off-policy ones safe.
        sampling: sampling settings put in the LLM resource for training rollouts
            (validation always uses ``temperature: 0``).
        val_every: greedy validation every k steps (0: only before and after).
        output_dir: ``metrics.jsonl`` and ``checkpoints/`` go here; a run resumes from them.
        publisher: how new weights reach the engine; default: ``LocalEnginePublisher`` over
            ``context.extras["engine"]``.
        on_step: called with each step's metrics (after logging).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        steps: int = 20,
        max_seconds: float | None = None,
        batch_size: int = 8,
        group_size: int = 8,
        train_config: Any = None,
        credit: str | CreditRule = "final",
        agent_match: str | None = None,
        merge: bool = True,
        normalize: Literal["std", "mean"] = "std",
        max_staleness: int = 0,
        mini_batches: int = 1,
        epochs: int = 1,
        sampling: dict[str, Any] | None = None,
        val_every: int = 5,
        output_dir: str | Path = "runs/grpo",
        checkpoint_every: int = 5,
        resume: bool = True,
        rollout_config: RolloutConfig | None = None,
        rollout_timeout: float = 600.0,
        max_empty_retries: int = 3,
        run_id: str = "grpo",
        seed: int = 0,
        publisher: Any = None,
        on_step: Callable[[dict[str, float]], None] | None = None,
    ) -> None:
        if batch_size < 1 or group_size < 2:
            raise ValueError("GRPO needs batch_size ≥ 1 and group_size ≥ 2 (a group needs two samples to compare)")
        self.model_dir = Path(model_dir)
        self.steps, self.max_seconds = steps, max_seconds
        self.batch_size, self.group_size = batch_size, group_size
        self.train_config = train_config
        self.adapter = TransitionAdapter(credit, agent_match=agent_match, merge=merge)
        self.normalize = normalize
        self.max_staleness = max_staleness
        if mini_batches < 1 or epochs < 1:
            raise ValueError(f"mini_batches and epochs must be >= 1, got {mini_batches} and {epochs}")
        self.mini_batches, self.epochs = mini_batches, epochs
        self.sampling = {"temperature": 1.0, **(sampling or {})}
        self.val_every = val_every
        self.output_dir = Path(output_dir)
        self.checkpoint_every, self.resume = checkpoint_every, resume
        self.rollout_config = rollout_config or RolloutConfig(timeout_seconds=300, max_attempts=1)
        self.rollout_timeout = rollout_timeout
        self.max_empty_retries = max_empty_retries
        self.run_id, self.seed = run_id, seed
        self.publisher = publisher
        self.on_step = on_step
        self.versions: list[str] = []

    # ---- resources -------------------------------------------------------------------------------
    def _publish_resources(self, store: Store, base: dict[str, Any], sampling: dict[str, Any],
                           model: str | None, tag: str) -> Resources:
        items: dict[str, Any] = {}
        for name, item in base.items():
            if isinstance(item, LLM):
                item = item.model_copy(update={"sampling": {**item.sampling, **sampling},
                                               "model": model or item.model})
            items[name] = item
        items["agentgrad_policy"] = {"model_version": self.versions[-1], "purpose": tag}
        return store.add_resources(items)

    def _validate(self, context: AlgorithmContext, resources_id: str) -> float:
        report = Evaluate(mode="val", timeout=self.rollout_timeout, resources_id=resources_id,
                          config=self.rollout_config).run(
            AlgorithmContext(store=context.store, train_tasks=context.val_tasks, val_tasks=context.val_tasks,
                             console=context.console))
        return float(statistics.fmean([r.reward or 0.0 for r in report.rollouts])) if report.rollouts else 0.0

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
            elif current - min(known) > self.max_staleness:
                stale += 1
            else:
                kept.append(t)
        return kept, stale, unknown

    # ---- the loop ----------------------------------------------------------------------------------
    def run(self, context: AlgorithmContext) -> GRPOResult:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from agentgrad.training import LocalEnginePublisher, PolicyTrainer, Sample, TrainConfig
        from agentgrad.training.policy import cursor_batches

        store, console = context.store, context.console
        tasks = list(context.train_tasks)
        if not tasks:
            raise ValueError("GRPO needs train_tasks")
        base = dict(context.initial_resources or {})
        if not base:
            latest = store.get_latest_resources()
            base = dict(latest.items) if latest else {}
        if not any(isinstance(v, LLM) for v in base.values()):
            raise ValueError("GRPO needs an LLM resource (Trainer.fit(..., resources={'llm': LLM(...)}))")
        publisher = self.publisher
        if publisher is None:
            engine = context.extras.get("engine")
            if engine is None:
                raise ValueError("GRPO needs a publisher, or an in-process engine: Trainer.fit(..., engine=engine)")
            publisher = LocalEnginePublisher(engine)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        ckpt_dir = self.output_dir / "checkpoints"
        trainer = PolicyTrainer(self.model_dir, self.train_config or TrainConfig())
        state = trainer.load_checkpoint(ckpt_dir) if self.resume else None
        cursor = int(state["cursor"]) if state else 0
        model_name = None
        if state:  # the engine must serve the checkpoint's weights, not the initial ones
            published = publisher.publish(trainer)
            model_name = published.model
            self.versions.append(published.version)
            console.print(f"[bold]resumed[/] from step {trainer.step} (task cursor {cursor})")
        else:
            self.versions.append(str(getattr(context.extras.get("engine"), "model_version", "v0")))
        train_res = self._publish_resources(store, base, self.sampling, model_name, "train")
        val_res = self._publish_resources(store, base, {"temperature": 0.0}, model_name, "val")
        result = GRPOResult(steps=trainer.step, output_dir=self.output_dir)
        metrics_file = (self.output_dir / "metrics.jsonl").open("a")
        started = time.monotonic()

        def log_metrics(step: int, values: dict[str, float]) -> None:
            values = {k: float(v) for k, v in values.items()}
            metrics_file.write(json.dumps({"step": step, "time": time.time(), **values}) + "\n")
            metrics_file.flush()
            store.add_metrics([MetricRecord(run_id=self.run_id, step=step, values=values)])

        def validate(step: int) -> None:
            if not context.val_tasks:
                return
            t0 = time.monotonic()
            score = self._validate(context, val_res.resources_id)
            result.validation.append((step, score))
            log_metrics(step, {"val/reward_mean": score, "val/seconds": time.monotonic() - t0})
            console.print(f"  [cyan]validation (greedy, {len(context.val_tasks)} tasks) at step {step}: {score:.3f}[/]")

        if trainer.step == 0:
            validate(0)
        batches = cursor_batches(len(tasks), self.batch_size, cursor, self.seed)
        last_step_seconds = 0.0
        empty_retries = 0
        indices, next_cursor = next(batches)
        progress = Progress(TextColumn("[bold]GRPO"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.description}"), console=console, transient=False)
        with progress:
            bar = progress.add_task("", total=self.steps, completed=trainer.step)
            while trainer.step < self.steps:
                elapsed = time.monotonic() - started
                if self.max_seconds is not None and elapsed + last_step_seconds > self.max_seconds:
                    console.print(f"time budget reached after {elapsed:.0f}s")
                    break
                step_started = time.monotonic()
                step = trainer.step + 1
                requests = [
                    RolloutRequest(input=tasks[i], mode="train", resources_id=train_res.resources_id,
                                   config=self.rollout_config,
                                   metadata={"group_id": f"{self.run_id}-s{step}-t{i}-r{empty_retries}", "step": step})
                    for i in indices for _ in range(self.group_size)
                ]
                # A step cannot wait forever for one stuck agent: stragglers are cancelled, and
                # then count as failed rollouts (no transitions).
                rollouts = run_batch(store, requests, timeout=self.rollout_timeout, on_straggler="cancel",
                                     label=f"GRPO step {step}").rollouts
                rollout_seconds = time.monotonic() - step_started
                transitions, astats = self.adapter.adapt(store, rollouts)
                transitions, stale, unknown = self._staleness_filter(transitions)
                if not transitions:
                    empty_retries += 1
                    failed = sum(r.status != RolloutStatus.SUCCEEDED for r in rollouts)
                    console.print(f"[yellow]step {step}: empty batch ({failed}/{len(rollouts)} rollouts failed, "
                                  f"{astats.rollouts_without_calls} without LLM calls) — not trained on; "
                                  f"retry {empty_retries}/{self.max_empty_retries}[/]")
                    log_metrics(step, {"empty_batch": 1.0, "rollouts_failed": failed})
                    if empty_retries > self.max_empty_retries:
                        raise RuntimeError(f"{empty_retries} empty batches in a row: every rollout failed or gave "
                                           "no usable LLM call; see the dashboard or `agentgrad dev`")
                    continue
                empty_retries = 0
                rewards = [r.reward for r in rollouts if r.reward is not None]
                kept, gstats = group_advantages(transitions, self.normalize)
                values: dict[str, float] = {
                    "reward/mean": statistics.fmean(rewards) if rewards else 0.0,
                    "reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
                    "success": sum((r or 0.0) > 0 for r in rewards) / max(1, len(rollouts)),
                    "rollouts": len(rollouts),
                    "rollouts_failed": sum(r.status != RolloutStatus.SUCCEEDED for r in rollouts),
                    "rollouts_per_second": len(rollouts) / max(rollout_seconds, 1e-9),
                    "stale_transitions": stale, "unknown_version_transitions": unknown,
                    **astats.as_metrics(), **gstats.as_metrics(),
                }
                train_seconds = 0.0
                if kept:
                    t0 = time.monotonic()
                    step_metrics = trainer.ppo_step([Sample.from_transition(t) for t in kept],
                                                    mini_batches=self.mini_batches, epochs=self.epochs)
                    published = publisher.publish(trainer)
                    self.versions.append(published.version)
                    model_name = published.model or model_name
                    train_res = self._publish_resources(store, base, self.sampling, model_name, "train")
                    val_res = self._publish_resources(store, base, {"temperature": 0.0}, model_name, "val")
                    train_seconds = time.monotonic() - t0
                    values.update({
                        "loss": step_metrics.loss, "entropy": step_metrics.entropy, "kl": step_metrics.kl,
                        "clip_fraction": step_metrics.clip_fraction, "grad_norm": step_metrics.grad_norm,
                        "updates": step_metrics.updates,
                        "tokens": step_metrics.tokens, "tokens_per_second": step_metrics.tokens_per_second,
                        "train_seconds": train_seconds,
                    })
                else:  # every group had identical rewards: nothing to learn from, move on
                    trainer.step += 1
                    console.print(f"[yellow]step {step}: all {gstats.groups} groups had zero reward variance — skipped[/]")
                cursor = next_cursor
                indices, next_cursor = next(batches)
                if trainer.step % self.checkpoint_every == 0 or trainer.step >= self.steps:
                    trainer.save_checkpoint(ckpt_dir, cursor=cursor, extra={"version": self.versions[-1]})
                step_seconds = time.monotonic() - step_started
                last_step_seconds = step_seconds
                values.update({
                    "step_seconds": step_seconds,
                    "trainer_idle_fraction": rollout_seconds / step_seconds,
                    "runner_idle_fraction": train_seconds / step_seconds,
                })
                log_metrics(trainer.step, values)
                result.history.append({"step": trainer.step, **values})
                update = (f"entropy {values['entropy']:.2f}  clip {values['clip_fraction']:.2f}  "
                          f"{values['tokens_per_second']:.0f} tok/s" if kept else "no update (no reward variance)")
                progress.update(bar, completed=trainer.step, description=(
                    f"reward {values['reward/mean']:.2f}  success {values['success']:.2f}  "
                    f"{update}  {values['rollouts_per_second']:.1f} ro/s"))
                if self.on_step is not None:
                    self.on_step(values)
                if self.val_every and trainer.step % self.val_every == 0 and trainer.step < self.steps:
                    validate(trainer.step)
        if trainer.step > 0 and trainer.step % self.checkpoint_every != 0:
            trainer.save_checkpoint(ckpt_dir, cursor=cursor, extra={"version": self.versions[-1]})
        validate(trainer.step)
        metrics_file.close()
        result.steps = trainer.step
        return result
