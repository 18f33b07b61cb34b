"""The training seam: what an algorithm needs from whatever updates the weights.

GRPO and SFT get their trainer from :func:`trainer_for`: the policy they were given
(``Trainer(policy=...)``) hands one out when it trains somewhere else, else they train locally.
Two implementations exist:

* the local one (the default) — a :class:`~agentgrad.training.policy.PolicyTrainer` (PyTorch in
  this process) over the algorithm's model directory; a
  :class:`~agentgrad.training.local.LocalPolicy` publishes its weights into its in-process engine;
* the Tinker one — :class:`~agentgrad.training.tinker.TinkerPolicy` hands out a
  :class:`~agentgrad.training.tinker.TinkerTrainer` whose steps run on a Tinker-API server
  (SkyRL's Tinker server, VeRL-Tinker, the hosted service), and serves rollouts from that
  server's sampler behind AgentGrad's own OpenAI-compatible app and capture proxy.

The protocol is the part of :class:`~agentgrad.training.policy.PolicyTrainer` the algorithms use,
so the local trainer satisfies it as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentgrad.training.interrupts import deferred_interrupts

if TYPE_CHECKING:
    from agentgrad.training.policy import Sample, StepMetrics, TrainConfig


@runtime_checkable
class TrainBackend(Protocol):
    """One policy's training state: weights (wherever they live), optimizer, step counter."""

    #: Steps done (a resumed run starts from its checkpoint's).
    step: int
    #: The run's length in steps (the horizon of ``TrainConfig.lr_decay``); set by GRPO.
    total_steps: int | None
    #: The local model directory: config, tokenizer and chat template (and the weights, locally).
    model_dir: Path
    #: Optimizer, loss and batching settings (its ``seed`` orders SFT's batches).
    config: TrainConfig

    @property
    def context_length(self) -> int | None:
        """The longest sequence the model takes, None when unknown."""
        ...

    def ppo_step(
        self,
        samples: Sequence[Sample],
        *,
        mini_batches: int = 1,
        epochs: int = 1,
        tokens_per_sample: float | None = None,
    ) -> StepMetrics:
        """One PPO-clip step over samples with advantages and sampled logprobs."""
        ...

    def nll_step(self, samples: Sequence[Sample]) -> StepMetrics:
        """One supervised (NLL) step over the samples' masked response tokens."""
        ...

    def skip_step(self) -> None:
        """Count a step that made no update."""
        ...

    def save_checkpoint(self, directory: str | Path, cursor: Any = None, extra: dict[str, Any] | None = None) -> Path:
        """Save weights, optimizer and step (plus the caller's data ``cursor``) under ``directory``."""
        ...

    def load_checkpoint(self, directory: str | Path, *, optimizer: bool = True) -> dict[str, Any] | None:
        """Restore the latest checkpoint under ``directory``; its ``cursor`` and ``extra``, or None."""
        ...


@dataclass
class Published:
    """What agents must use from now on."""

    version: str
    #: The model name to request (the adapter's name for vLLM LoRA); None: keep the current one.
    model: str | None = None


class Publisher(Protocol):
    """How a trainer's new weights reach the server its rollouts sample from (implementations:
    :mod:`agentgrad.training.publish`, :class:`~agentgrad.training.tinker.TinkerPublisher`)."""

    def publish(self, trainer: TrainBackend) -> Published:
        """Make the trainer's current weights served; return the new version."""
        ...


class TrainablePolicy(Protocol):
    """A served policy that can also hand out its trainer (what ``Trainer(policy=...)`` takes)."""

    model_dir: Path

    def trainer(self, config: TrainConfig) -> TrainBackend:
        """A trainer of this policy's weights with ``config``."""
        ...

    def publisher(self) -> Publisher:
        """How a trainer's new weights reach this policy's server."""
        ...


def trainer_for(policy: Any, model_dir: str | Path, config: TrainConfig | None) -> TrainBackend:
    """The trainer an algorithm trains with: the policy's own when it hands one out (a
    :class:`TrainablePolicy`: the Tinker backend), else a local
    :class:`~agentgrad.training.policy.PolicyTrainer` over ``model_dir``. No ``config``: the
    defaults of :class:`~agentgrad.training.policy.TrainConfig`."""
    from agentgrad.training.policy import PolicyTrainer, TrainConfig

    if policy is not None and hasattr(policy, "trainer"):
        return policy.trainer(config or TrainConfig())

    return PolicyTrainer(model_dir, config)


def export_policy(trainer: TrainBackend, out_dir: str | Path) -> Path:
    """Write ``trainer``'s current policy to ``out_dir`` so it can be served again; return it: a
    Hugging Face model directory for the local trainer (LoRA merged in), the server's sampler
    weights named beside the tokenizer and config for a remote one (its own ``export``)."""
    from agentgrad.training.export import export_model
    from agentgrad.training.policy import PolicyTrainer

    if isinstance(trainer, PolicyTrainer) or not hasattr(trainer, "export"):  # a trainer, or a checkpoint path
        return export_model(trainer, out_dir)  # type: ignore[arg-type]
    return trainer.export(out_dir)


def fit_sequences(
    trainer: TrainBackend,
    samples: Sequence[Sample],
    *,
    steps: int,
    batch_size: int = 16,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 1,
    on_step: Callable[[int, StepMetrics], None] | None = None,
) -> list[StepMetrics]:
    """Supervised fine-tuning on ``samples`` for ``steps`` optimizer steps (NLL on masked tokens).

    With ``checkpoint_dir``, the run resumes from its latest checkpoint (model, optimizer, step
    and the data cursor) and checkpoints every ``checkpoint_every`` steps, so a killed run
    continues where it stopped and sees the same data order.
    """
    from agentgrad.training.policy import cursor_batches

    if not samples:
        raise ValueError("fit_sequences needs at least one sample")
    cursor = 0
    if checkpoint_dir is not None:
        state = trainer.load_checkpoint(checkpoint_dir)
        cursor = int(state["cursor"]) if state else 0
    history: list[StepMetrics] = []
    batches = cursor_batches(len(samples), batch_size, cursor, trainer.config.seed)
    while trainer.step < steps:
        with deferred_interrupts():  # Ctrl-C or SIGTERM waits for the step and its checkpoint
            indices, cursor = next(batches)
            metrics = trainer.nll_step([samples[i] for i in indices])
            history.append(metrics)
            if checkpoint_dir is not None and (trainer.step % checkpoint_every == 0 or trainer.step == steps):
                trainer.save_checkpoint(checkpoint_dir, cursor=cursor)
        if on_step is not None:
            on_step(trainer.step, metrics)
    return history
