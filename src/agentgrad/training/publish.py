"""Weight publishing: after each update, the inference engine serves the new policy under a new
version, and the algorithm publishes resources naming it.

Three publishers:

* :class:`LocalEnginePublisher` — the in-process engine (``agentgrad.inference``): the full
  weights (LoRA merged in) are copied into it with ``engine.update_weights(state_dict)``; the
  engine drains running requests first, so each response comes from exactly one version. With
  ``lora_hot_swap`` a LoRA trainer's adapter is hot-loaded instead (``engine.load_lora``), under a
  new name that agents then request.
* :class:`ModelServerPublisher` — an AgentGrad model server started separately (``agentgrad
  serve-model DIR``): the full weights are written as one safetensors file into a directory the
  server can read at the same path, and loaded over its ``/v1/update_weights`` endpoint (the
  same drain-then-swap on the server's engine).
* :class:`VLLMLoRAPublisher` — a vLLM server started with ``--enable-lora`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``: the adapter is saved to a shared directory and
  loaded over vLLM's HTTP API (``/v1/load_lora_adapter``) under a new name; agents then ask for
  that name as their model. (GPU-tested only where a GPU is available.)
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

from agentgrad.http.guard import MODEL_TOKEN_ENV, env_token
from agentgrad.training.backend import Published, TrainBackend
from agentgrad.training.policy import PolicyTrainer


def _bearer(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header for a model server's token (given, else ``$AGENTGRAD_MODEL_TOKEN``)."""
    key = api_key or env_token(MODEL_TOKEN_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def local_trainer(trainer: TrainBackend) -> PolicyTrainer:
    """``trainer`` as the in-process trainer the publishers below read weights from (anything with
    ``engine_state_dict``); a trainer whose weights live elsewhere (a Tinker server) is refused
    with what to use instead."""
    if not hasattr(trainer, "engine_state_dict"):
        raise TypeError(
            f"{type(trainer).__name__} keeps its weights outside this process: publish them with its "
            "policy's own publisher (policy.publisher()), not a local one"
        )
    return cast(PolicyTrainer, trainer)


class LocalEnginePublisher:
    """Publishes a trainer's weights into an in-process :class:`~agentgrad.inference.engine.Engine`.

    By default the trainer's weights, LoRA merged in, are copied in (``update_weights``) as version
    ``v<step>``. With ``lora_hot_swap`` a LoRA trainer's adapter is saved instead (to a temporary
    directory this publisher owns) and hot-loaded as ``policy-v<step>``, which is both the version
    and the model name agents request from then on: the base weights are never copied (SmolLM2-135M:
    0.34 s a publish instead of 1.95 s), but every decoding step then runs the adapter beside the
    base weights (SmolLM2's rollouts took about 1.5× as long on 2 CPU cores), which is why it is
    not the default for an engine in this process. The newest ``keep`` adapters stay loaded, so
    requests already queued for the previous version (overlap, ``max_staleness`` 1) still run;
    older ones are unloaded (their running requests finish first) and their files removed.
    """

    def __init__(self, engine: Any, *, lora_hot_swap: bool = False, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (the served adapter), got {keep}")
        self.engine = engine
        self.lora_hot_swap = lora_hot_swap
        self.keep = keep
        #: The model name of the newest published adapter (None: the base model serves the policy).
        self.model: str | None = None
        self._adapters: list[str] = []
        self._adapter_dir: tempfile.TemporaryDirectory[str] | None = None

    def publish(self, trainer: TrainBackend) -> Published:
        trainer = local_trainer(trainer)
        if trainer.is_lora and self.lora_hot_swap:
            return self._load_adapter(trainer)
        version = self.engine.update_weights(trainer.engine_state_dict(), version=f"v{trainer.step}")
        return Published(version=str(version))

    def _load_adapter(self, trainer: PolicyTrainer) -> Published:
        if self._adapter_dir is None:
            self._adapter_dir = tempfile.TemporaryDirectory(prefix="agentgrad-adapters-")
        name = f"policy-v{trainer.step}"
        root = Path(self._adapter_dir.name)
        trainer.model.save_pretrained(str(root / name))
        self.engine.load_lora(name, root / name)  # a name loaded before (a resumed step) is replaced
        if name in self._adapters:
            self._adapters.remove(name)
        self._adapters.append(name)
        while len(self._adapters) > self.keep:
            old = self._adapters.pop(0)
            self.engine.unload_lora(old)
            shutil.rmtree(root / old, ignore_errors=True)
        self.model = name
        return Published(version=name, model=name)


class ModelServerPublisher:
    """Publishes to an AgentGrad model server started elsewhere (``agentgrad serve-model DIR``).

    Each :meth:`publish` writes the trainer's full weights (LoRA merged in, the engine's names) to
    ``work_dir/v<step>/model.safetensors``, then asks the server to load that directory with
    ``POST {base_url}/v1/update_weights {"path", "version": "v<step>"}``. The server reads the
    file itself, so it must see ``work_dir`` at the same absolute path: the same machine, or a
    filesystem shared by both. Its engine lets running requests finish on the old weights first;
    the call returns once the new ones are served. The last ``keep`` weight directories stay
    (the newest is the one served); older ones are removed.

    ``base_url`` is the server's root or ``/v1`` URL (what ``serve-model`` prints). An unreachable
    server raises :class:`ConnectionError`, a refusal :class:`RuntimeError`; both name the URL
    (and the server's error body). ``api_key`` is the server's token (``serve-model --token``);
    default ``$AGENTGRAD_MODEL_TOKEN``.
    """

    def __init__(
        self, base_url: str, work_dir: str | Path, *, keep: int = 2, timeout: float = 600.0, api_key: str | None = None
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (the served weights), got {keep}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.url = f"{self.base_url}/v1/update_weights"
        self.work_dir = Path(work_dir).resolve()
        self.keep = keep
        self.timeout = timeout
        self.headers = _bearer(api_key)
        self._written: list[Path] = []

    def publish(self, trainer: TrainBackend) -> Published:
        version = f"v{trainer.step}"
        directory = self._write(local_trainer(trainer), version)
        payload = {"path": str(directory), "version": version}
        try:
            served = self._post(payload, directory)
        except BaseException:
            if directory not in self._written:  # nothing serves it
                shutil.rmtree(directory, ignore_errors=True)
            raise
        self._prune(directory)
        return Published(version=served)

    def _post(self, payload: dict[str, Any], directory: Path) -> str:
        from agentgrad.http.transport import request_json

        try:
            reply = request_json("POST", self.url, payload, headers=self.headers, timeout=self.timeout)
        except OSError as exc:
            raise ConnectionError(f"model server at {self.url} could not be reached: {exc}") from exc
        if reply.status >= 400:
            raise RuntimeError(
                f"model server at {self.url} refused weights {directory}: HTTP {reply.status} {reply.text[:500]}"
            )
        try:
            return str(reply.json()["model_version"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(
                f"model server at {self.url} answered without a model_version: {reply.text[:300]}"
            ) from exc

    def _write(self, trainer: PolicyTrainer, version: str) -> Path:
        from safetensors.torch import save_file

        state: dict[str, Any] = {}
        seen: set[int] = set()
        for name, tensor in trainer.engine_state_dict().items():
            tensor = tensor.detach().cpu().contiguous()
            if tensor.data_ptr() in seen:  # safetensors refuses shared storage (tied weights)
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            state[name] = tensor
        target = self.work_dir / version
        tmp = self.work_dir / f".tmp-{version}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file(state, str(tmp / "model.safetensors"))
        shutil.rmtree(target, ignore_errors=True)  # a re-publish of the same step: the server read it already
        tmp.rename(target)
        return target

    def _prune(self, served: Path) -> None:
        if served in self._written:
            self._written.remove(served)
        self._written.append(served)
        while len(self._written) > self.keep:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)


class VLLMLoRAPublisher:
    """Saves the LoRA adapter and hot-loads it into a vLLM server as ``{prefix}-{step}``.

    ``adapter_dir`` must be readable by the vLLM server at the same path. The previous adapter
    is unloaded after the new one is loaded, so in-flight requests finish on it. ``api_key``: the
    server's token (vLLM's ``--api-key``, or a model server's ``--token``); default
    ``$AGENTGRAD_MODEL_TOKEN``.
    """

    def __init__(
        self,
        base_url: str,
        adapter_dir: str | Path,
        prefix: str = "policy",
        api_key: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.adapter_dir = Path(adapter_dir)
        self.prefix = prefix
        self.headers = _bearer(api_key)
        self.timeout = timeout
        self._current: str | None = None

    def publish(self, trainer: TrainBackend) -> Published:
        from agentgrad.http.transport import request_json

        trainer = local_trainer(trainer)
        if not trainer.is_lora:
            raise ValueError("VLLMLoRAPublisher needs a LoRA policy (TrainConfig(lora=LoraSettings()))")
        name = f"{self.prefix}-{trainer.step}"
        path = (self.adapter_dir / name).resolve()
        trainer.model.save_pretrained(str(path))
        response = request_json(
            "POST",
            f"{self.base_url}/v1/load_lora_adapter",
            {"lora_name": name, "lora_path": str(path)},
            headers=self.headers,
            timeout=self.timeout,
        )
        if response.status >= 400:
            raise RuntimeError(f"vLLM refused adapter {name}: HTTP {response.status} {response.text[:300]}")
        if self._current is not None:
            request_json(
                "POST",
                f"{self.base_url}/v1/unload_lora_adapter",
                {"lora_name": self._current},
                headers=self.headers,
                timeout=self.timeout,
            )
        self._current = name
        return Published(version=name, model=name)
