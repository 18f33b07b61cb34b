"""Training on a Tinker-API server: SkyRL's Tinker server, VeRL-Tinker, the hosted Tinker service.

When one machine is not enough, AgentGrad does not grow its own distributed trainer: it hands
its token-level samples to an engine that has one. The Tinker API is the smallest such seam —
``forward_backward`` over token data, ``optim_step``, ``save_weights_and_get_sampling_client`` and
``sample`` — and it takes exactly what AgentGrad produces (token ids, sampled logprobs, per-token
advantages). Everything else stays as it is: agents, runners, the store, the capture proxy, the
adapter and GRPO's own loop; only the update and the sampling move to the server.

:class:`TinkerPolicy` is the policy to give a :class:`~agentgrad.trainer.Trainer`: it serves
rollouts from the server's current sampler behind AgentGrad's OpenAI-compatible app (chat
template, tool-call parsing, token ids, logprobs) and capture proxy, and hands GRPO and SFT a
:class:`TinkerTrainer` (:mod:`agentgrad.training.backend`).

Exactness. AgentGrad's PPO-clip loss sums per-token terms over an update's trained tokens and
divides by their count N (or by ``samples × tokens_per_sample`` for Dr. GRPO). A Tinker server
computes the same per-token term, ``-min(r·A, clip(r, lo, hi)·A)`` with the loss weights as the
mask, and then reduces: SkyRL's JAX backend takes each sequence's weighted mean and averages the
sequences (``reduction="sequence_mean"``); the hosted service sums (``reduction="sum"``). The
term is linear in A, so scaling each datum's advantages by ``B·nᵢ/N`` (sequence mean over B
sequences, nᵢ trained tokens in sequence i) or by ``1/N`` (sum) gives exactly AgentGrad's loss
and gradient (:func:`advantage_scales`; a test checks it on a hand-computed example). Two
differences remain, both documented: the server does not clamp the log-ratio to ±20 (only an
astronomically off-policy token would notice), and SFT's NLL under ``sequence_mean`` weights
sequences equally (a loss weight scale cancels in the per-sequence mean).

Settings the server cannot honour — a KL penalty, an entropy bonus, dropout, LoRA alpha or
target modules — are refused with a message, never dropped.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentgrad.errors import AgentGradError
from agentgrad.training.backend import Published
from agentgrad.training.checkpoints import commit_checkpoint, latest_checkpoint
from agentgrad.training.local import LocalPolicy
from agentgrad.training.policy import (
    LoraSettings,
    Sample,
    StepMetrics,
    TrainConfig,
    default_lr,
    step_lr,
    trainable_samples,
    trained_tokens,
    update_parts,
)

if TYPE_CHECKING:
    from agentgrad.inference.tinker_sampler import TinkerSamplerEngine

log = logging.getLogger(__name__)

#: The Tinker client releases this backend is tested with. The protocol moves between releases
#: (a 0.38 client made SkyRL 0.3's server answer HTTP 500), so the extra pins this range.
TINKER_CLIENT = "tinker>=0.24.1,<0.25"

Reduction = Literal["sequence_mean", "sum"]


class TinkerError(AgentGradError):
    """The Tinker backend cannot do what was asked (a missing client, a setting it cannot honour)."""


def import_tinker() -> Any:
    """The ``tinker`` client module, or an error that says how to install it."""
    try:
        import tinker
    except ImportError as exc:
        raise TinkerError(
            f"the Tinker backend needs the tinker client: pip install 'agentgrad[tinker]' (it pins {TINKER_CLIENT})"
        ) from exc
    return tinker


@dataclass
class TinkerSettings:
    """Where the Tinker server is and how it computes."""

    base_url: str
    """The server's root URL (``http://127.0.0.1:8000`` for a local SkyRL Tinker server)."""
    base_model: str | None = None
    """The model name the server serves (SkyRL: its ``--base-model``; default: the local model
    directory's absolute path, which is what a SkyRL server on the same machine was given)."""
    api_key: str | None = None
    """The server's API key (default ``$TINKER_API_KEY``; SkyRL accepts any ``tml-`` key)."""
    reduction: Reduction = "sequence_mean"
    """How the server reduces per-token losses: ``sequence_mean`` (SkyRL's backends) or ``sum``
    (the hosted service). Advantages are scaled so the loss is AgentGrad's either way."""
    loss_fn: Literal["ppo", "importance_sampling"] = "ppo"
    """``ppo``: clipped with ``TrainConfig.clip_eps_low/high``; ``importance_sampling``: unclipped
    (for servers without ``ppo``)."""
    timeout: float = 900.0
    """Seconds one server call may take (the first ones compile: minutes on a CPU JAX backend)."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"TinkerSettings.base_url must be an http(s) URL, got {self.base_url!r}")
        if self.reduction not in ("sequence_mean", "sum"):
            raise ValueError(f"TinkerSettings.reduction must be 'sequence_mean' or 'sum', got {self.reduction!r}")
        if self.loss_fn not in ("ppo", "importance_sampling"):
            raise ValueError(f"TinkerSettings.loss_fn must be 'ppo' or 'importance_sampling', got {self.loss_fn!r}")


# ---------------------------------------------------------------------------------------------
# samples → Tinker data
# ---------------------------------------------------------------------------------------------


def advantage_scales(samples: Sequence[Sample], normalizer: float, reduction: Reduction) -> list[float]:
    """Per-sample factors on the advantages that make the server's reduction equal AgentGrad's
    ``Σ tokens / normalizer`` (see the module doc): ``B·nᵢ/normalizer`` for ``sequence_mean``,
    ``1/normalizer`` for ``sum``."""
    if reduction == "sum":
        return [1.0 / normalizer] * len(samples)
    return [len(samples) * sum(s.mask) / normalizer for s in samples]  # type: ignore[arg-type]


def datum_fields(sample: Sample, *, scale: float = 1.0, ppo: bool = True) -> tuple[list[int], dict[str, list[Any]]]:
    """``(model_input, loss_fn_inputs)`` of one sample: the input is every token but the last, the
    targets every token but the first; prompt positions carry weight 0. With ``ppo`` the sampled
    logprobs and the scaled advantages ride along (prompt positions: 0)."""
    tokens = [*sample.prompt_ids, *sample.response_ids]
    pad = len(sample.prompt_ids) - 1
    mask = list(sample.mask)  # type: ignore[arg-type]
    inputs: dict[str, list[Any]] = {"target_tokens": tokens[1:], "weights": [0.0] * pad + [float(m) for m in mask]}
    if ppo:
        old = sample.old_logprobs
        if old is None or any(m and (v is None or math.isnan(v)) for m, v in zip(mask, old, strict=True)):
            raise TinkerError(
                "a training sample has no sampled logprobs for its trained tokens: the Tinker "
                "backend needs them (the capture proxy records them when the server returns them)"
            )
        inputs["logprobs"] = [0.0] * pad + [float(v) if m else 0.0 for m, v in zip(mask, old, strict=True)]
        inputs["advantages"] = [0.0] * pad + [sample.advantage * scale if m else 0.0 for m in mask]
    return tokens[:-1], inputs


def to_datums(samples: Sequence[Sample], *, normalizer: float, reduction: Reduction, ppo: bool = True) -> list[Any]:
    """The samples as Tinker ``Datum`` objects (see :func:`datum_fields`, :func:`advantage_scales`)."""
    types = import_tinker().types
    out = []
    for sample, scale in zip(samples, advantage_scales(samples, normalizer, reduction), strict=True):
        model_input, inputs = datum_fields(sample, scale=scale, ppo=ppo)
        out.append(types.Datum(model_input=types.ModelInput.from_ints(model_input), loss_fn_inputs=inputs))
    return out


@dataclass
class _UpdateStats:
    """What one update's returned logprobs say, computed here (the server returns no metrics)."""

    loss: float = 0.0
    tokens: float = 0.0
    clipped: float = 0.0
    ratio: float = 0.0
    ratio_max: float = float("nan")


def ppo_stats(
    samples: Sequence[Sample],
    logprobs: Sequence[Sequence[float]],
    normalizer: float,
    *,
    clip_low: float,
    clip_high: float,
) -> _UpdateStats:
    """AgentGrad's PPO-clip loss and diagnostics of one update, from the per-target logprobs the
    server computed before the update (``loss_fn_outputs[i]["logprobs"]``)."""
    stats = _UpdateStats()
    ratios: list[float] = []
    for sample, row in zip(samples, logprobs, strict=True):
        pad = len(sample.prompt_ids) - 1
        for j, (m, old) in enumerate(zip(sample.mask, sample.old_logprobs, strict=True)):  # type: ignore[arg-type]
            if not m:
                continue
            r = math.exp(max(-20.0, min(20.0, float(row[pad + j]) - old)))
            a = sample.advantage
            unclipped, clipped = -a * r, -a * min(max(r, clip_low), clip_high)
            stats.loss += max(unclipped, clipped) / normalizer
            stats.clipped += clipped > unclipped
            stats.tokens += 1
            ratios.append(r)
    stats.ratio = sum(ratios)
    stats.ratio_max = max(ratios, default=float("nan"))
    return stats


# ---------------------------------------------------------------------------------------------
# the trainer
# ---------------------------------------------------------------------------------------------


def _refuse_unsupported(config: TrainConfig) -> None:
    """Settings the Tinker API has no field for: refused, never silently dropped."""
    problems = []
    if config.kl_coef:
        problems.append(f"kl_coef={config.kl_coef} (the API's losses have no KL term)")
    if config.entropy_coef:
        problems.append(f"entropy_coef={config.entropy_coef} (the API's losses have no entropy term)")
    if config.dropout:
        problems.append("dropout=True (the server decides)")
    lora = config.lora
    if lora is not None:
        default = LoraSettings(r=lora.r)
        if (lora.alpha, lora.dropout, lora.target_modules) != (default.alpha, default.dropout, default.target_modules):
            problems.append(
                "lora alpha, dropout or target_modules (the API takes the rank only; the server picks the rest)"
            )
    if config.device not in ("auto", "cpu") or config.dtype != "auto" or config.autocast is not None:
        problems.append("device/dtype/autocast (the server's hardware decides)")
    if problems:
        raise TinkerError("the Tinker backend cannot honour: " + "; ".join(problems))


def _model_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{model_dir} has no config.json: the Tinker backend needs the model's local "
            "directory (config and tokenizer) to render prompts and count parameters"
        )
    return json.loads(path.read_text())


def _parameter_count(model_dir: Path) -> int:
    """The model's parameters, counted on the meta device (nothing is allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))
    return sum(p.numel() for p in model.parameters())


class TinkerTrainer:
    """A :class:`~agentgrad.training.backend.TrainBackend` whose steps run on a Tinker server.

    It holds a LoRA training client (the Tinker API trains adapters: rank from
    ``TrainConfig.lora``, else 32). ``ppo_step`` cuts the samples into ``epochs`` × ``mini_batches``
    updates exactly as the local trainer does; each update is one ``forward_backward`` and one
    ``optim_step`` with Adam settings mapped one to one (and the step's learning rate from
    ``lr_decay``). Diagnostics (loss, clip fraction, ratios) are computed here from the logprobs
    the server returns. Checkpoints are the server's ``save_state`` plus a local ``state.json``
    with the step and the algorithm's data cursor.
    """

    def __init__(
        self, model_dir: str | Path, config: TrainConfig, settings: TinkerSettings, *, service_client: Any = None
    ) -> None:
        from dataclasses import replace

        _refuse_unsupported(config)
        self.model_dir = Path(model_dir)
        self.settings = settings
        self._model_config = _model_config(self.model_dir)
        self.base_model = settings.base_model or str(self.model_dir.resolve())
        self.rank = config.lora.r if config.lora is not None else 32
        if config.lr is None:
            config = replace(config, lr=default_lr(_parameter_count(self.model_dir), lora=True))
            log.info("learning rate %g picked for the model's size with LoRA", config.lr)
        self.config = config
        self.step = 0
        self.total_steps: int | None = None
        self._saved: dict[int, str] = {}  # step → the server's checkpoint path
        tinker = import_tinker()
        self._types = tinker.types
        self.service = service_client or tinker.ServiceClient(
            base_url=settings.base_url, api_key=settings.api_key or _env_key()
        )
        self.client = self.service.create_lora_training_client(
            base_model=self.base_model, rank=self.rank, seed=config.seed
        )

    @property
    def context_length(self) -> int | None:
        return self._model_config.get("max_position_embeddings")

    def model_record(self) -> dict[str, Any]:
        return {"path": self.base_model, "server": self.settings.base_url, "lora": {"r": self.rank}}

    def skip_step(self) -> None:
        self.step += 1

    # ---- steps ------------------------------------------------------------------------------------
    def ppo_step(
        self,
        samples: Sequence[Sample],
        *,
        mini_batches: int = 1,
        epochs: int = 1,
        tokens_per_sample: float | None = None,
    ) -> StepMetrics:
        """One PPO step (see the class doc); the same cut into updates as the local trainer."""
        config = self.config
        loss_config = (
            {"clip_low_threshold": 1.0 - config.clip_eps_low, "clip_high_threshold": 1.0 + config.clip_eps_high}
            if self.settings.loss_fn == "ppo"
            else None
        )
        high = 1.0 + config.clip_eps_high if self.settings.loss_fn == "ppo" else math.inf
        low = 1.0 - config.clip_eps_low if self.settings.loss_fn == "ppo" else 0.0
        updates = update_parts(
            self._trainable(samples), mini_batches=mini_batches, epochs=epochs, seed=config.seed, step=self.step
        )
        started, lr = time.perf_counter(), step_lr(config, self.step, self.total_steps)
        totals = _UpdateStats(ratio_max=float("-inf"))
        losses, norms = [], []
        for part in updates:
            normalizer = len(part) * tokens_per_sample if tokens_per_sample else float(trained_tokens(part))
            data = to_datums(part, normalizer=normalizer, reduction=self.settings.reduction)
            out = self._call(
                self.client.forward_backward(data, loss_fn=self.settings.loss_fn, loss_fn_config=loss_config)
            )
            stats = ppo_stats(
                part, [o["logprobs"].tolist() for o in out.loss_fn_outputs], normalizer, clip_low=low, clip_high=high
            )
            norms.append(self._optim_step(lr))
            losses.append(stats.loss)
            totals.tokens += stats.tokens
            totals.clipped += stats.clipped
            totals.ratio += stats.ratio
            totals.ratio_max = max(totals.ratio_max, stats.ratio_max)
        self.step += 1
        tokens = max(totals.tokens, 1.0)
        return StepMetrics(
            loss=statistics.fmean(losses),
            tokens=int(totals.tokens),
            seconds=time.perf_counter() - started,
            grad_norm=_mean(norms),
            clip_fraction=totals.clipped / tokens,
            ratio_mean=totals.ratio / tokens,
            ratio_max=totals.ratio_max,
            lr=lr,
            micro_batches=len(losses),
            updates=len(losses),
        )

    def nll_step(self, samples: Sequence[Sample]) -> StepMetrics:
        """One supervised step (``cross_entropy``); under ``sequence_mean`` sequences weigh
        equally (see the module doc)."""
        part = self._trainable(samples)
        started, lr = time.perf_counter(), step_lr(self.config, self.step, self.total_steps)
        tokens = float(trained_tokens(part))
        data = to_datums(part, normalizer=tokens, reduction=self.settings.reduction, ppo=False)
        out = self._call(self.client.forward_backward(data, loss_fn="cross_entropy"))
        loss = 0.0
        for sample, o in zip(part, out.loss_fn_outputs, strict=True):
            row, pad = o["logprobs"].tolist(), len(sample.prompt_ids) - 1
            loss -= sum(row[pad + j] for j, m in enumerate(sample.mask) if m) / tokens  # type: ignore[arg-type]
        norm = self._optim_step(lr)
        self.step += 1
        return StepMetrics(
            loss=loss, tokens=int(tokens), seconds=time.perf_counter() - started, grad_norm=norm, lr=lr, micro_batches=1
        )

    def _trainable(self, samples: Sequence[Sample]) -> list[Sample]:
        return trainable_samples(samples, context=self.context_length, model=self.base_model)

    def _optim_step(self, lr: float) -> float:
        config = self.config
        params = self._types.AdamParams(
            learning_rate=lr,
            beta1=config.betas[0],
            beta2=config.betas[1],
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
            grad_clip_norm=config.grad_clip,
        )
        response = self._call(self.client.optim_step(params))
        metrics = getattr(response, "metrics", None) or {}  # SkyRL names it "skyrl.ai/grad_norm"
        return next((float(v) for k, v in metrics.items() if k.rsplit("/", 1)[-1] == "grad_norm"), float("nan"))

    def _call(self, future: Any) -> Any:
        return future.result(timeout=self.settings.timeout)

    # ---- weights ------------------------------------------------------------------------------------
    def sampling_client(self) -> Any:
        """Save the current weights for sampling and return the server's sampler of them."""
        return self.client.save_weights_and_get_sampling_client()

    def save_checkpoint(
        self, directory: str | Path, cursor: Any = None, extra: dict[str, Any] | None = None, keep: int = 2
    ) -> Path:
        """The server saves weights and optimizer (``save_state``); ``step-NNNNNN/state.json``
        here records the server's path, the step and the data cursor."""
        # A step saved twice (a run's last step) keeps the server's first save: the weights are the
        # same, and servers refuse a second checkpoint of the same name (SkyRL ignores ``overwrite``).
        path = self._saved.get(self.step)
        if path is None:
            path = self._saved[self.step] = self._call(self.client.save_state(f"agentgrad-step-{self.step:06d}")).path

        def fill(tmp: Path) -> None:
            (tmp / "state.json").write_text(
                json.dumps(
                    {
                        "step": self.step,
                        "cursor": cursor,
                        "extra": extra or {},
                        "lora": True,
                        "model": self.model_record(),
                        "tinker_path": path,
                        "time": time.time(),
                    }
                )
            )

        return commit_checkpoint(directory, self.step, fill, keep=keep)

    def load_checkpoint(self, directory: str | Path, *, optimizer: bool = True) -> dict[str, Any] | None:
        target = latest_checkpoint(directory)
        if target is None:
            return None
        state = json.loads((target / "state.json").read_text())
        if "tinker_path" not in state:
            raise TinkerError(
                f"checkpoint {target} was written by the local trainer, not through the Tinker API: "
                "resume it with the local backend, or start a new output directory"
            )
        load = self.client.load_state_with_optimizer if optimizer else self.client.load_state
        self._call(load(state["tinker_path"]))
        self.step = int(state["step"])
        log.info("resumed from %s (step %d, server checkpoint %s)", target, self.step, state["tinker_path"])
        return state

    def export(self, out_dir: str | Path) -> Path:
        """Save sampler weights on the server and write where they are (``tinker_weights.json``)
        with the tokenizer and config, so the export names a servable model."""
        from agentgrad.training.export import copy_base_files

        out = Path(out_dir)
        # sampler weights are never overwritten on the server: each export gets its own name
        name = f"agentgrad-{out.name}-step-{self.step:06d}-{time.time_ns()}"
        path = self._call(self.client.save_weights_for_sampler(name)).path
        out.mkdir(parents=True, exist_ok=True)
        copy_base_files(self.model_dir, out)
        shutil.copy2(self.model_dir / "config.json", out / "config.json")
        (out / "tinker_weights.json").write_text(
            json.dumps(
                {
                    "sampler_path": path,
                    "base_model": self.base_model,
                    "server": self.settings.base_url,
                    "step": self.step,
                    "time": time.time(),
                },
                indent=2,
            )
            + "\n"
        )
        return out


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.fmean(finite) if finite else float("nan")


def _env_key() -> str:
    import os

    return os.environ.get("TINKER_API_KEY") or "tml-agentgrad"


# ---------------------------------------------------------------------------------------------
# serving: the policy a Trainer is given
# ---------------------------------------------------------------------------------------------


class TinkerPublisher:
    """Publishes by asking the server for a sampler of the trainer's current weights and
    switching the sampling engine to it (requests already running finish on the old one)."""

    def __init__(self, engine: TinkerSamplerEngine) -> None:
        self.engine = engine

    def publish(self, trainer: Any) -> Published:
        if not isinstance(trainer, TinkerTrainer):
            raise TinkerError(
                "TinkerPolicy publishes TinkerTrainer weights only (the trainer came from "
                "elsewhere: give the algorithm no publisher of its own)"
            )
        return Published(version=self.engine.switch(trainer.sampling_client(), f"v{trainer.step}"))


class TinkerPolicy(LocalPolicy):
    """A policy trained and sampled on a Tinker server, served to agents through AgentGrad's own
    OpenAI-compatible app and capture proxy (so every agent framework works unchanged).

    ``model_dir`` is the model's local directory (config, tokenizer, chat template); the server
    serves ``settings.base_model`` (default: that directory's path). Rollouts before the first
    publish sample the base model.
    """

    def __init__(
        self,
        model_dir: str | Path,
        settings: TinkerSettings,
        *,
        served_model_name: str | None = None,
        proxy_host: str = "127.0.0.1",
        proxy_port: int = 0,
        max_concurrency: int = 64,
    ) -> None:
        super().__init__(
            model_dir,
            served_model_name=served_model_name,
            proxy_host=proxy_host,
            proxy_port=proxy_port,
            max_batch_size=max_concurrency,
        )
        self.settings = settings
        self._trainer: TinkerTrainer | None = None
        self._trainer_config: TrainConfig | None = None
        self._lock = threading.Lock()
        tinker = import_tinker()
        self.service = tinker.ServiceClient(base_url=settings.base_url, api_key=settings.api_key or _env_key())

    def _make_engine(self) -> Any:
        from agentgrad.inference.tinker_sampler import TinkerSamplerEngine

        base = self.settings.base_model or str(self.model_dir.resolve())
        sampler = self.service.create_sampling_client(base_model=base)
        return TinkerSamplerEngine(
            self.model_dir, sampler, max_concurrency=self.max_batch_size, timeout=self.settings.timeout
        )

    def trainer(self, config: TrainConfig) -> TinkerTrainer:
        """The trainer of this policy on the server (one per policy: the server holds its adapter)."""
        with self._lock:
            if self._trainer is None:
                self._trainer = TinkerTrainer(self.model_dir, config, self.settings, service_client=self.service)
                self._trainer_config = config
            elif config != self._trainer_config:
                raise TinkerError(
                    "this TinkerPolicy already trains with other settings: one policy, one "
                    "adapter on the server (use a new TinkerPolicy for another run)"
                )
            return self._trainer

    def publisher(self) -> TinkerPublisher:
        return TinkerPublisher(self._require_started("TinkerPolicy.publisher()"))  # type: ignore[arg-type]

    def _check_model(self) -> None:
        _model_config(self.model_dir)
