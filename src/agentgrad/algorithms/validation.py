"""Greedy validation that keeps the best model: one home for GRPO's and SFT's.

A run's last model is not always its best (RL can rise and then fall), so every algorithm that
validates keeps the model of its best validation score as a Hugging Face directory
``output_dir/best``, with the step and score in ``best.json``. A resumed run reads them back,
so it never replaces a better model with a worse one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgrad.algorithms.base import AlgorithmContext
from agentgrad.algorithms.baseline import Evaluate
from agentgrad.types import LLM, RolloutConfig

if TYPE_CHECKING:
    from agentgrad.store.protocol import Store
    from agentgrad.training.policy import PolicyTrainer


def with_sampling(items: Mapping[str, Any], sampling: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
    """``items`` with every LLM resource's sampling settings updated (and its model renamed, for
    engines that serve a new version under a new name: LoRA adapters)."""
    out: dict[str, Any] = {}
    for name, item in items.items():
        if isinstance(item, LLM):
            item = item.model_copy(update={"sampling": {**item.sampling, **sampling}, "model": model or item.model})
        out[name] = item
    return out


class BestModel:
    """The validation curve of a run and its best model so far.

    Args:
        output_dir: where ``best/`` and ``best.json`` go.
        timeout: seconds one validation waits for its rollouts (stragglers are cancelled, scored 0).
        rollout_config: the validation rollouts' config (timeouts, attempts).
        run: the run's name in the store (its metrics' ``run_id``): each validation rollout
            carries it as ``validation_of`` and the step as ``step``, so the dashboard lists a
            run's validation rollouts with its training ones.
    """

    def __init__(
        self,
        output_dir: str | Path,
        *,
        timeout: float | None = None,
        rollout_config: RolloutConfig | None = None,
        run: str | None = None,
    ) -> None:
        self.output_dir = Path(output_dir)
        self.timeout, self.rollout_config, self.run = timeout, rollout_config, run
        #: (step, greedy validation reward mean), in the order measured.
        self.curve: list[tuple[int, float]] = []
        self.step: int | None = None
        self.score: float | None = None
        self._warned = False  # about LLM calls that did not ask for the greedy temperature

    def validate(
        self,
        store: Store,
        tasks: Sequence[Any],
        step: int,
        trainer: PolicyTrainer | Any,
        *,
        resources_id: str | None,
        console: Any,
    ) -> dict[str, float]:
        """Run every task once with the (greedy) resources ``resources_id``; a strictly better mean
        reward than any before exports ``trainer``'s model to ``output_dir/best``. Returns the
        validation metrics ({} without tasks)."""
        if not tasks:
            return {}
        started = time.monotonic()
        evaluate = Evaluate(
            mode="val",
            timeout=self.timeout,
            resources_id=resources_id,
            config=self.rollout_config,
            metadata={"validation_of": self.run, "step": step} if self.run else None,
        )
        report = evaluate.run(
            AlgorithmContext(store=store, train_tasks=list(tasks), val_tasks=list(tasks), console=console)
        )
        score = report.score
        self.curve.append((step, score))
        console.print(f"  [cyan]validation (greedy, {len(tasks)} tasks) at step {step}: {score:.3f}[/]")
        if not self._warned and (warning := report.temperature_warning()):
            console.print(f"  [yellow]warning:[/] {warning}")  # once a run: the agent does not change
            self._warned = True
        if self.score is None or score > self.score:
            self._keep(trainer, step, score, console)
        return {"val/reward_mean": score, "val/seconds": time.monotonic() - started}

    def _keep(self, trainer: PolicyTrainer | Any, step: int, score: float, console: Any) -> None:
        from agentgrad.training.backend import export_policy

        export_policy(trainer, self.output_dir / "best")
        self.step, self.score = step, score
        (self.output_dir / "best.json").write_text(json.dumps({"step": step, "score": score}))
        console.print(f"  [cyan]new best ({score:.3f}) at step {step}: {self.output_dir / 'best'}[/]")

    def load(self, logged: Sequence[Mapping[str, Any]]) -> None:
        """Read back what a previous run of the same ``output_dir`` recorded: the best step and
        score (``best.json``), and the validation curve from its ``logged`` records (``RunLog``'s
        ``read_back``), so that a resumed run reports the run's start, not its own."""
        path = self.output_dir / "best.json"
        if path.exists():
            best = json.loads(path.read_text())
            self.step, self.score = int(best["step"]), float(best["score"])
        scores = {int(r["step"]): float(r["val/reward_mean"]) for r in logged if "val/reward_mean" in r}
        self.curve = sorted(scores.items())  # a step validated twice (before and after a crash): the last
