"""``VERL(config)`` and ``APO(client, ...)``: Agent Lightning's algorithms mapped onto AgentGrad's.

``VERL`` reads the VERL/Hydra-style dictionary Agent Lightning examples pass and turns it into a
:class:`~agentgrad.algorithms.grpo.GRPOConfig` and a model directory; the Trainer then runs
AgentGrad's GRPO on a :class:`~agentgrad.training.local.LocalPolicy` of that model. Every key is
in exactly one of three tables, checked when ``VERL(config)`` is created:

* :data:`VERL_SETTINGS`: a key with an AgentGrad equivalent (``data.train_batch_size`` →
  ``batch_size``…), translated; a value AgentGrad cannot honour (``adv_estimator: gae``) is an
  error naming what it supports;
* :data:`VERL_MACHINERY`: a key that tunes VERL's own distributed machinery (FSDP offload, vLLM
  memory share, per-GPU micro-batch sizes) and changes nothing that is learned; AgentGrad sizes
  these itself. They are accepted and listed, with the reason, in one warning and in
  ``VERL.not_applied``;
* anything else is an error naming the key (never a silent drop).

``APO`` keeps Agent Lightning's constructor (an OpenAI client and model names) and runs
AgentGrad's APO (beam search with a critic and an editor).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from agentgrad.algorithms.apo import APO as _APO
from agentgrad.algorithms.apo import ChatEndpoint
from agentgrad.algorithms.base import AlgorithmContext
from agentgrad.algorithms.grpo import GRPOConfig
from agentgrad.algorithms.trackers import TRACKER_NAMES
from agentgrad.compat._al_types import UnsupportedError
from agentgrad.training.policy import LoraSettings, TrainConfig
from agentgrad.types import PromptTemplate

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A setting translator: (value, the whole flattened config) → GRPOConfig updates (``train.x`` for
#: TrainConfig fields, ``lora.x`` for LoRA fields, ``sampling.x`` for sampling settings).
Translate = Callable[[Any, Mapping[str, Any]], dict[str, Any]]


def _to(field: str, cast: Callable[[Any], Any] = lambda v: v) -> Translate:
    return lambda value, _: {field: cast(value)}


def _only(allowed: Any, why: str) -> Translate:
    """A key AgentGrad honours only at one value (its own behaviour); another value is refused."""

    def check(value: Any, _: Mapping[str, Any]) -> dict[str, Any]:
        if value != allowed:
            raise UnsupportedError(f"{why} (got {value!r})")
        return {}

    return check


def _choice(key: str, field: str, values: Mapping[Any, Any]) -> Translate:
    """A key whose few values each map to an AgentGrad value; another value is refused."""

    def translate(value: Any, _: Mapping[str, Any]) -> dict[str, Any]:
        if value not in values:
            raise UnsupportedError(f"{key}={value!r} is not supported: use one of {list(values)}")
        return {field: values[value]}

    return translate


def _mini_batches(value: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    batch = int(config.get("data.train_batch_size", GRPOConfig.batch_size))
    if value <= 0 or batch % int(value):
        raise UnsupportedError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={value} must divide "
            f"data.train_batch_size={batch}: AgentGrad makes batch/mini-batch optimizer updates "
            "per step (GRPOConfig.mini_batches)"
        )
    return {"mini_batches": batch // int(value)}


def _kl(value: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    use = config.get("actor_rollout_ref.actor.use_kl_loss", False)
    return {"train.kl_coef": float(value) if use else 0.0}


def _use_kl(value: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    if value and "actor_rollout_ref.actor.kl_loss_coef" not in config:
        raise UnsupportedError(
            "actor_rollout_ref.actor.use_kl_loss=True needs kl_loss_coef (AgentGrad's train.kl_coef)"
        )
    return {}


def _trackers(value: Any, _: Mapping[str, Any]) -> dict[str, Any]:
    names = [value] if isinstance(value, str) else list(value)
    unknown = [n for n in names if n != "console" and n not in TRACKER_NAMES]
    if unknown:
        raise UnsupportedError(
            f"trainer.logger {unknown} is not supported: AgentGrad logs to the console, "
            f"metrics.jsonl and the store, and to the trackers {list(TRACKER_NAMES)}"
        )
    return {"trackers": [n for n in names if n != "console"]}


def _positive_freq(field: str) -> Translate:
    def translate(value: Any, _: Mapping[str, Any]) -> dict[str, Any]:
        if int(value) <= 0:  # VERL's -1: never (AgentGrad still validates/checkpoints after the last step)
            return {field: 0 if field == "val_every" else 10**9}
        return {field: int(value)}

    return translate


def _device(value: Any, _: Mapping[str, Any]) -> dict[str, Any]:
    if value not in ("cuda", "cpu", "auto") and not str(value).startswith("cuda:"):
        raise UnsupportedError(f"trainer.device={value!r} is not supported: AgentGrad trains on cpu, cuda or cuda:N")
    return {"train.device": value}


def _one(key: str) -> Translate:
    return _only(
        1,
        f"{key} > 1 is not supported: AgentGrad trains on one device (its engine serves on the same "
        "machine); run on one GPU",
    )


def _lora_rank(value: Any, _: Mapping[str, Any]) -> dict[str, Any]:
    return {"lora.r": int(value)} if int(value) > 0 else {}


#: VERL keys with an AgentGrad equivalent: dotted key → translator.
#: VERL's group estimators that AgentGrad has (``GRPOConfig.estimator``); its
#: ``reinforce_plus_plus_baseline`` is REINFORCE++ with the group mean as baseline, as ours.
_VERL_ESTIMATORS = {"grpo": "grpo", "rloo": "rloo", "reinforce_plus_plus_baseline": "reinforce++"}


def _estimator(config: Mapping[str, Any]) -> str:
    """The estimator that ``algorithm.adv_estimator`` and ``algorithm.norm_adv_by_std_in_grpo``
    name together (both keys translate to this one value, so their order does not matter):
    GRPO without the division by σ is Dr. GRPO's advantage (VERL reads the flag for GRPO only)."""
    name = config.get("algorithm.adv_estimator", "grpo")
    if name not in _VERL_ESTIMATORS:
        raise UnsupportedError(
            f"algorithm.adv_estimator={name!r} is not supported: AgentGrad implements the group estimators "
            f"(GRPO and its kin) {sorted(_VERL_ESTIMATORS)}"
        )
    by_std = config.get("algorithm.norm_adv_by_std_in_grpo", True)
    if by_std not in (True, False):
        raise UnsupportedError(f"algorithm.norm_adv_by_std_in_grpo={by_std!r} must be true or false")
    estimator = _VERL_ESTIMATORS[name]
    return "dr_grpo" if estimator == "grpo" and by_std is False else estimator


VERL_SETTINGS: dict[str, Translate] = {
    "algorithm.adv_estimator": lambda _, config: {"estimator": _estimator(config)},
    "algorithm.use_kl_in_reward": _only(
        False,
        "algorithm.use_kl_in_reward: AgentGrad puts the KL penalty in the "
        "loss, not the reward: set actor.use_kl_loss and kl_loss_coef",
    ),
    "algorithm.norm_adv_by_std_in_grpo": lambda _, config: {"estimator": _estimator(config)},
    "data.train_batch_size": _to("batch_size", int),
    "data.max_response_length": _to("sampling.max_tokens", int),
    "actor_rollout_ref.rollout.n": _to("group_size", int),
    "actor_rollout_ref.rollout.temperature": _to("sampling.temperature", float),
    "actor_rollout_ref.rollout.top_p": _to("sampling.top_p", float),
    "actor_rollout_ref.rollout.val_kwargs.temperature": _only(
        0, "rollout.val_kwargs.temperature: AgentGrad validates greedily (temperature 0)"
    ),
    "actor_rollout_ref.rollout.val_kwargs.do_sample": _only(
        False, "rollout.val_kwargs.do_sample: AgentGrad validates greedily"
    ),
    "actor_rollout_ref.rollout.val_kwargs.n": _only(1, "rollout.val_kwargs.n: AgentGrad validates each task once"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": _mini_batches,
    "actor_rollout_ref.actor.ppo_epochs": _to("epochs", int),
    "actor_rollout_ref.actor.optim.lr": _to("train.lr", float),
    "actor_rollout_ref.actor.optim.weight_decay": _to("train.weight_decay", float),
    "actor_rollout_ref.actor.use_kl_loss": _use_kl,
    "actor_rollout_ref.actor.kl_loss_coef": _kl,
    "actor_rollout_ref.actor.kl_loss_type": _only(
        "low_var_kl", "actor.kl_loss_type: AgentGrad's KL term is the k3 estimate ('low_var_kl')"
    ),
    "actor_rollout_ref.actor.entropy_coeff": _to("train.entropy_coef", float),
    "actor_rollout_ref.actor.clip_ratio": lambda v, _: {
        "train.clip_eps_low": float(v),
        "train.clip_eps_high": float(v),
    },
    "actor_rollout_ref.actor.clip_ratio_low": _to("train.clip_eps_low", float),
    "actor_rollout_ref.actor.clip_ratio_high": _to("train.clip_eps_high", float),
    "actor_rollout_ref.actor.grad_clip": _to("train.grad_clip", float),
    "actor_rollout_ref.actor.loss_agg_mode": _only(
        "token-mean", "actor.loss_agg_mode: AgentGrad averages the loss over tokens ('token-mean')"
    ),
    "actor_rollout_ref.model.path": lambda v, _: {"model_dir": str(v)},
    "actor_rollout_ref.model.lora_rank": _lora_rank,
    "actor_rollout_ref.model.lora_alpha": _to("lora.alpha", int),
    "actor_rollout_ref.model.target_modules": _to("lora.target_modules"),
    "trainer.val_before_train": _only(
        True,
        "trainer.val_before_train: AgentGrad always validates before the first "
        "step when there are validation tasks; pass no val_dataset to skip",
    ),
    "trainer.critic_warmup": _only(0, "trainer.critic_warmup: GRPO has no critic"),
    "trainer.logger": _trackers,
    "trainer.experiment_name": _to("run_id", str),
    "trainer.test_freq": _positive_freq("val_every"),
    "trainer.save_freq": _positive_freq("checkpoint_every"),
    "trainer.total_epochs": _to("total_epochs", int),
    "trainer.total_training_steps": _to("steps", int),
    "trainer.default_local_dir": _to("output_dir", str),
    "trainer.device": _device,
    "trainer.resume_mode": _choice("trainer.resume_mode", "resume", {"auto": True, "disable": False}),
    "trainer.n_gpus_per_node": _one("trainer.n_gpus_per_node"),
    "trainer.nnodes": _one("trainer.nnodes"),
    "agentlightning.trace_aggregator.level": _choice(
        "agentlightning.trace_aggregator.level", "merge", {"trajectory": True, "transition": False}
    ),
}

_MEMORY = "memory/throughput only: AgentGrad sizes micro-batches by tokens (GRPOConfig train.micro_batch_tokens)"
_VLLM = "VERL's vLLM rollout settings: AgentGrad serves the model with its own engine"
_FSDP = "FSDP sharding/offload: AgentGrad trains in one process"

#: VERL keys (dotted prefixes) that tune VERL's own machinery: accepted, listed in a warning.
VERL_MACHINERY: dict[str, str] = {
    "data.train_files": "the tasks come from fit(train_dataset=...)",
    "data.val_files": "the tasks come from fit(val_dataset=...)",
    "data.max_prompt_length": "AgentGrad never truncates a captured prompt (a prompt longer than the model's "
    "context fails at the engine)",
    "data.truncation": "AgentGrad never truncates a captured prompt",
    "actor_rollout_ref.rollout.name": _VLLM,
    "actor_rollout_ref.rollout.mode": _VLLM,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": _VLLM,
    "actor_rollout_ref.rollout.gpu_memory_utilization": _VLLM,
    "actor_rollout_ref.rollout.engine_kwargs": _VLLM,
    "actor_rollout_ref.rollout.multi_turn": "AgentGrad's engine parses tool calls in the chat template's own format",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": _MEMORY,
    "actor_rollout_ref.rollout.max_num_batched_tokens": _VLLM,
    "actor_rollout_ref.rollout.enforce_eager": _VLLM,
    "actor_rollout_ref.rollout.free_cache_engine": _VLLM,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": _MEMORY,
    "actor_rollout_ref.actor.ppo_micro_batch_size": _MEMORY,
    "actor_rollout_ref.actor.use_dynamic_bsz": _MEMORY,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": _MEMORY,
    "actor_rollout_ref.actor.fsdp_config": _FSDP,
    "actor_rollout_ref.actor.use_torch_compile": "AgentGrad does not compile the model",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": _MEMORY,
    "actor_rollout_ref.ref.fsdp_config": _FSDP,
    "actor_rollout_ref.model.use_remove_padding": "AgentGrad packs rows by prefix itself",
    "actor_rollout_ref.model.enable_gradient_checkpointing": _MEMORY,
    "trainer.project_name": "trackers read WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME",
    "agentlightning.trace_aggregator.trajectory_max_prompt_length": "AgentGrad never truncates a captured sequence",
    "agentlightning.trace_aggregator.trajectory_max_response_length": "AgentGrad never truncates a captured sequence",
}


def _flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        machinery = next((m for m in VERL_MACHINERY if dotted == m or dotted.startswith(m + ".")), None)
        if isinstance(value, Mapping) and value and dotted not in VERL_SETTINGS and machinery is None:
            yield from _flatten(value, dotted + ".")
        else:
            yield dotted, value


class VERL:
    """``agentlightning.VERL(config)``: GRPO on a local model, set from a VERL config dictionary.

    ``actor_rollout_ref.model.path`` (a local Hugging Face model directory) is required. Checked
    when created: a key with no AgentGrad equivalent, or a value it cannot honour, raises
    :class:`UnsupportedError` naming the key and what to use instead.
    """

    def __init__(self, config: Mapping[str, Any], trainer_cls: Any = None, daemon_cls: Any = None) -> None:
        if trainer_cls is not None or daemon_cls is not None:
            raise UnsupportedError(
                "VERL(trainer_cls=, daemon_cls=) is not supported: AgentGrad's GRPO is "
                "agentgrad.algorithms.grpo.GRPO; subclass it and pass it to agentgrad.Trainer"
            )
        self.config = config
        flat = dict(_flatten(config))
        updates: dict[str, Any] = {}
        #: Keys accepted without effect (VERL's machinery), with the reason.
        self.not_applied: dict[str, str] = {}
        unknown = []
        for key, value in flat.items():
            machinery = next((m for m in VERL_MACHINERY if key == m or key.startswith(m + ".")), None)
            if key in VERL_SETTINGS:
                updates.update(VERL_SETTINGS[key](value, flat))
            elif machinery is not None:
                self.not_applied[key] = VERL_MACHINERY[machinery]
            else:
                unknown.append(key)
        if unknown:
            raise UnsupportedError(
                f"VERL config key(s) {unknown} have no AgentGrad equivalent. Remove them; the keys AgentGrad "
                f"maps are {sorted(VERL_SETTINGS)} (see docs/migrating-from-agent-lightning.md), and any GRPO "
                "setting can be set directly with agentgrad.GRPO(model_dir, GRPOConfig(...)) and agentgrad.Trainer"
            )
        if "model_dir" not in updates:
            raise UnsupportedError(
                "VERL config needs actor_rollout_ref.model.path: a local Hugging Face model "
                "directory (AgentGrad loads it with transformers and serves it itself)"
            )
        self.model_dir = Path(updates.pop("model_dir"))
        self.trackers: list[str] = updates.pop("trackers", [])
        self.total_epochs: int = updates.pop("total_epochs", 1)
        self._updates = updates
        if self.not_applied:
            log.warning(
                "VERL config keys that tune VERL's own machinery and have no effect in AgentGrad:\n%s",
                "\n".join(f"  {k}: {why}" for k, why in self.not_applied.items()),
            )
        self.grpo_config(1)  # every value checked now (GRPOConfig validates), not when fit() starts

    def grpo_config(self, n_train_tasks: int, agent_match: str | None = None) -> GRPOConfig:
        """The GRPO settings for a run on ``n_train_tasks`` tasks (``total_epochs`` → steps, as
        VERL counts them: whole batches per epoch)."""
        plain = {k: v for k, v in self._updates.items() if "." not in k}
        train = {k[6:]: v for k, v in self._updates.items() if k.startswith("train.")}
        lora = {k[5:]: v for k, v in self._updates.items() if k.startswith("lora.")}
        sampling = {k[9:]: v for k, v in self._updates.items() if k.startswith("sampling.")}
        if lora:
            if "r" not in lora:
                raise UnsupportedError("actor_rollout_ref.model.lora_alpha/target_modules need lora_rank > 0")
            train["lora"] = LoraSettings(**lora)
        batch_size = plain.get("batch_size", GRPOConfig.batch_size)
        if "steps" not in plain:
            plain["steps"] = max(1, self.total_epochs * (n_train_tasks // batch_size))
        config = GRPOConfig(
            **plain, train=dataclasses.replace(TrainConfig(), **train), sampling={"temperature": 1.0, **sampling}
        )
        return dataclasses.replace(config, agent_match=agent_match) if agent_match is not None else config


class APO(_APO, Generic[T]):
    """``agentlightning.APO(async_openai_client, ...)``: AgentGrad's APO with a critic
    (``gradient_model``) and an editor (``apply_edit_model``) at the client's base URL.

    The prompt it optimizes is the one ``PromptTemplate`` among the Trainer's ``initial_resources``
    (under any name, as in Agent Lightning).
    """

    def __init__(
        self,
        async_openai_client: Any,
        *,
        gradient_model: str = "gpt-5-mini",
        apply_edit_model: str = "gpt-4.1-mini",
        diversity_temperature: float = 1.0,
        gradient_batch_size: int = 4,
        val_batch_size: int = 16,
        beam_width: int = 4,
        branch_factor: int = 4,
        beam_rounds: int = 3,
        rollout_batch_timeout: float = 3600.0,
        run_initial_validation: bool = True,
        _poml_trace: bool = False,
    ) -> None:
        if not run_initial_validation:
            raise UnsupportedError(
                "APO(run_initial_validation=False) is not supported: AgentGrad's APO scores the "
                "seed prompt first (the beam starts from it)"
            )
        if _poml_trace:
            raise UnsupportedError(
                "APO(_poml_trace=True) is not supported: AgentGrad's critic and editor prompts are "
                "plain text; each critique is stored on the rollouts it read (apo_critique)"
            )
        base_url = str(getattr(async_openai_client, "base_url", "") or "")
        if not base_url:
            raise UnsupportedError("APO needs an OpenAI client with a base_url (AsyncOpenAI(base_url=...))")
        api_key = getattr(async_openai_client, "api_key", None)
        critic = ChatEndpoint(base_url, gradient_model, api_key, temperature=diversity_temperature)
        editor = ChatEndpoint(base_url, apply_edit_model, api_key, temperature=diversity_temperature)
        super().__init__(
            critic,
            editor,
            beam_width=beam_width,
            branch_factor=branch_factor,
            rounds=beam_rounds,
            train_batch_size=gradient_batch_size,
            val_batch_size=val_batch_size,
            wait_timeout=rollout_batch_timeout,
        )

    def run(self, context: AlgorithmContext) -> Any:
        items = dict(context.initial_resources or {})
        if not items and (latest := context.store.get_latest_resources()) is not None:
            items = dict(latest.items)
        prompts = [name for name, item in items.items() if isinstance(item, PromptTemplate)]
        if len(prompts) != 1:
            raise UnsupportedError(
                f"APO optimizes the one PromptTemplate of initial_resources; found "
                f"{prompts or 'none'} among {sorted(items)}"
            )
        self.prompt_name = prompts[0]
        return super().run(context)
