"""Weight publishing: after each update, the inference engine serves the new policy under a new
version, and the algorithm publishes resources naming it.

Two publishers:

* :class:`LocalEnginePublisher` — the in-process engine (``agentgrad.inference``): the full
  weights (LoRA merged in) are copied into it with ``engine.update_weights(state_dict)``; the
  engine drains running requests first, so each response comes from exactly one version.
* :class:`VLLMLoRAPublisher` — a vLLM server started with ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: the adapter is saved to a shared directory and
  loaded over vLLM's HTTP API (``/v1/load_lora_adapter``) under a new name; agents then ask for
  that name as their model. (GPU-tested only where a GPU is available.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agentgrad.training.policy import PolicyTrainer


@dataclass
class Published:
    """What agents must use from now on."""

    version: str
    #: The model name to request (the adapter's name for vLLM LoRA); None: keep the current one.
    model: str | None = None


class Publisher(Protocol):
    def publish(self, trainer: PolicyTrainer) -> Published:
        """Make the trainer's current weights served; return the new version."""
        ...


class LocalEnginePublisher:
    """Copies weights into an in-process :class:`~agentgrad.inference.engine.Engine`."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def publish(self, trainer: PolicyTrainer) -> Published:
        version = self.engine.update_weights(trainer.engine_state_dict(), version=f"v{trainer.step}")
        return Published(version=str(version))


class VLLMLoRAPublisher:
    """Saves the LoRA adapter and hot-loads it into a vLLM server as ``{prefix}-{step}``.

    ``adapter_dir`` must be readable by the vLLM server at the same path. The previous adapter
    is unloaded after the new one is loaded, so in-flight requests finish on it.
    """

    def __init__(self, base_url: str, adapter_dir: str | Path, prefix: str = "policy",
                 api_key: str | None = None, timeout: float = 120.0) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.adapter_dir = Path(adapter_dir)
        self.prefix = prefix
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = timeout
        self._current: str | None = None

    def publish(self, trainer: PolicyTrainer) -> Published:
        from agentgrad.http.transport import request_json

        if not trainer.is_lora:
            raise ValueError("VLLMLoRAPublisher needs a LoRA policy (TrainConfig(lora=LoraSettings()))")
        name = f"{self.prefix}-{trainer.step}"
        path = (self.adapter_dir / name).resolve()
        trainer.model.save_pretrained(str(path))
        response = request_json("POST", f"{self.base_url}/v1/load_lora_adapter",
                                {"lora_name": name, "lora_path": str(path)}, headers=self.headers, timeout=self.timeout)
        if response.status >= 400:
            raise RuntimeError(f"vLLM refused adapter {name}: HTTP {response.status} {response.text[:300]}")
        if self._current is not None:
            request_json("POST", f"{self.base_url}/v1/unload_lora_adapter", {"lora_name": self._current},
                         headers=self.headers, timeout=self.timeout)
        self._current = name
        return Published(version=name, model=name)
