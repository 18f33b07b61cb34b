"""Policy training (transformers + peft): PPO-clip and NLL steps, checkpoints, weight publishing,
export to a Hugging Face model directory.

``policy`` imports torch; this package's names load it on first use, so ``import
agentgrad.training`` stays light and nothing on ``import agentgrad``'s path imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.training.backend import Published as Published
    from agentgrad.training.backend import Publisher as Publisher
    from agentgrad.training.backend import fit_sequences as fit_sequences
    from agentgrad.training.export import export_model as export_model
    from agentgrad.training.local import LocalPolicy as LocalPolicy
    from agentgrad.training.policy import LoraSettings as LoraSettings
    from agentgrad.training.policy import PolicyTrainer as PolicyTrainer
    from agentgrad.training.policy import Sample as Sample
    from agentgrad.training.policy import StepMetrics as StepMetrics
    from agentgrad.training.policy import TrainConfig as TrainConfig
    from agentgrad.training.policy import check_model as check_model
    from agentgrad.training.policy import default_lr as default_lr
    from agentgrad.training.policy import micro_batches as micro_batches
    from agentgrad.training.policy import nll_loss as nll_loss
    from agentgrad.training.policy import ppo_clip_loss as ppo_clip_loss
    from agentgrad.training.publish import LocalEnginePublisher as LocalEnginePublisher
    from agentgrad.training.publish import ModelServerPublisher as ModelServerPublisher
    from agentgrad.training.publish import VLLMLoRAPublisher as VLLMLoRAPublisher

_EXPORTS = {
    "TrainConfig": "agentgrad.training.policy",
    "LoraSettings": "agentgrad.training.policy",
    "LocalPolicy": "agentgrad.training.local",
    "PolicyTrainer": "agentgrad.training.policy",
    "Sample": "agentgrad.training.policy",
    "StepMetrics": "agentgrad.training.policy",
    "fit_sequences": "agentgrad.training.backend",
    "micro_batches": "agentgrad.training.policy",
    "nll_loss": "agentgrad.training.policy",
    "ppo_clip_loss": "agentgrad.training.policy",
    "check_model": "agentgrad.training.policy",
    "default_lr": "agentgrad.training.policy",
    "export_model": "agentgrad.training.export",
    "Publisher": "agentgrad.training.backend",
    "Published": "agentgrad.training.backend",
    "LocalEnginePublisher": "agentgrad.training.publish",
    "VLLMLoRAPublisher": "agentgrad.training.publish",
    "ModelServerPublisher": "agentgrad.training.publish",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
