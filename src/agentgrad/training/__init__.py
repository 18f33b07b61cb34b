"""Policy training (transformers + peft): PPO-clip and NLL steps, checkpoints, weight publishing.

Importing this package imports torch; nothing on ``import agentgrad``'s path imports it.
"""

from agentgrad.training.policy import (
    LoraSettings,
    PolicyTrainer,
    Sample,
    StepMetrics,
    TrainConfig,
    fit_sequences,
    micro_batches,
    nll_loss,
    ppo_clip_loss,
)
from agentgrad.training.publish import LocalEnginePublisher, Published, Publisher, VLLMLoRAPublisher

__all__ = [
    "LocalEnginePublisher", "LoraSettings", "PolicyTrainer", "Published", "Publisher", "Sample", "StepMetrics",
    "TrainConfig", "VLLMLoRAPublisher", "fit_sequences", "micro_batches", "nll_loss", "ppo_clip_loss",
]
