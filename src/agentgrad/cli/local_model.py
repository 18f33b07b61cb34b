"""An agent's tasks run once on a local model: ``agentgrad eval --model`` and ``agentgrad dev
--model`` without an endpoint, and ``train --test``'s scores.

The model — a named tiny model, a Hugging Face directory, or a training run or checkpoint
(exported first) — is checked, then served by the embedded engine behind the capture proxy, so
its calls are recorded with their token ids as in training. Not a command group itself.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgrad.cli.named_models import resolve_model

if TYPE_CHECKING:
    from agentgrad.algorithms.baseline import EvaluationReport
    from agentgrad.types import RolloutConfig, RolloutMode


def run_on_local_model(
    model: str,
    agent: Any,
    tasks: list[Any],
    store: Any,
    *,
    llm_resource: str,
    sampling: dict[str, Any],
    engine: Mapping[str, Any] | None = None,
    runners: int = 1,
    concurrency: int = 1,
    timeout: float | None = None,
    run_id: str | None = None,
    mode: RolloutMode = "train",
    config: RolloutConfig | None = None,
    quiet: bool = False,
) -> EvaluationReport:
    """Run every task once with ``model`` served locally as the LLM resource ``llm_resource``
    (``sampling``: ``{"temperature": 0.0}`` for greedy), recorded in ``store`` (as the run
    ``run_id`` when given); prints the summary unless ``quiet``. ``engine``: LocalPolicy's engine
    keywords (:func:`~agentgrad.cli.named_models.engine_keywords`). A directory that is not a usable
    model is refused, naming what it lacks, before anything starts."""
    from agentgrad.trainer import Trainer
    from agentgrad.training.local import LocalPolicy
    from agentgrad.training.policy import check_model

    with tempfile.TemporaryDirectory(prefix="agentgrad-model-") as work:
        model_dir = resolve_model(model)
        if not (model_dir / "config.json").is_file():  # a training run or a checkpoint: export it first
            from agentgrad.training.export import export_model

            model_dir = export_model(model_dir, Path(work) / "model")
        check_model(model_dir)
        with LocalPolicy(model_dir, **(engine or {})).serving(store) as policy:
            trainer = Trainer(
                store, policy=policy, n_runners=runners, concurrency=concurrency, llm_resource=llm_resource
            )
            return trainer.dev(
                agent,
                tasks,
                {llm_resource: policy.llm(**sampling)},
                timeout=timeout,
                run_id=run_id,
                mode=mode,
                config=config,
                print_summary=not quiet,
            )
