"""An engine whose generations come from a Tinker server's sampler.

The OpenAI-compatible app (:mod:`agentgrad.inference.app`) renders chat templates, parses tool
calls and returns token ids and logprobs over any object with the
:class:`~agentgrad.inference.engine.Engine` surface it uses (``submit``, ``tokenizer``,
``model_version``, ``max_model_len``, ``renders_tools``, ``loras``). This one sends each
request to a Tinker ``SamplingClient`` (``sample``: token ids and their logprobs back) and
switches to a new sampler when the trainer publishes one, so the capture proxy and every agent
framework work against a Tinker-trained policy unchanged.

A request keeps the sampler it started on: one response never mixes two versions, as with the
local engine's drain-then-swap.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentgrad.inference.engine import (
    EngineError,
    GenerationResult,
    RequestError,
    SamplingParams,
    TokenEvent,
    template_renders_tools,
)


class TinkerSamplerEngine:
    """Generations from ``sampling_client`` (a ``tinker.SamplingClient``), rendered with the
    tokenizer in ``model_dir``. ``max_concurrency`` requests are in flight at once (the server
    batches them)."""

    def __init__(
        self,
        model_dir: str | Path,
        sampling_client: Any,
        *,
        version: str = "v0",
        max_concurrency: int = 64,
        timeout: float = 900.0,
    ) -> None:
        from transformers import AutoTokenizer

        self.model_dir: Path | None = Path(model_dir)
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.max_model_len = int(config.get("max_position_embeddings") or 2048)
        self.vocab_size = int(config.get("vocab_size") or len(self.tokenizer))
        self._eos_ids = sorted(_eos_ids(Path(model_dir), config, self.tokenizer))
        self._client, self._version = sampling_client, version
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="agentgrad-tinker-sample")
        self._timeout = timeout
        self._renders_tools: bool | None = None
        self._closed = False

    @property
    def model_version(self) -> str:
        return self._version

    @property
    def renders_tools(self) -> bool:
        if self._renders_tools is None:
            self._renders_tools = template_renders_tools(self.tokenizer)
        return self._renders_tools

    @property
    def loras(self) -> list[str]:
        return []

    def switch(self, sampling_client: Any, version: str) -> str:
        """Serve new requests from ``sampling_client`` as ``version``; running ones finish on the old."""
        with self._lock:
            self._client, self._version = sampling_client, version
        return version

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        lora: str | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> Future:
        """Queue a generation; the future resolves to a :class:`GenerationResult`. ``on_token``
        gets every token once the server has answered (the Tinker API does not stream)."""
        params = params or SamplingParams()
        self._validate(prompt_ids, params, lora)
        if self._closed:
            raise EngineError("engine is closed")
        with self._lock:
            client, version = self._client, self._version
        return self._pool.submit(self._sample, client, version, list(prompt_ids), params, on_token)

    def generate(
        self, prompt_ids: list[int], params: SamplingParams | None = None, *, lora: str | None = None
    ) -> GenerationResult:
        return self.submit(prompt_ids, params, lora=lora).result()

    def update_weights(self, *_args: Any, **_kwargs: Any) -> str:
        raise EngineError(
            "this engine samples from a Tinker server: weights change through the Tinker API "
            "(the trainer's publish), not by upload"
        )

    def load_lora(self, *_args: Any, **_kwargs: Any) -> None:
        raise EngineError("this engine samples from a Tinker server: it loads no local adapters")

    def unload_lora(self, *_args: Any, **_kwargs: Any) -> None:
        raise EngineError("this engine samples from a Tinker server: it has no local adapters")

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- internals ----------------------------------------------------------------------------
    def _validate(self, prompt_ids: list[int], params: SamplingParams, lora: str | None) -> None:
        if lora is not None:
            raise RequestError(f"lora {lora!r} is not loaded (a Tinker sampler serves one policy)", "model")
        if not prompt_ids:
            raise RequestError("prompt is empty", "prompt")
        if any(not isinstance(t, int) or t < 0 or t >= self.vocab_size for t in prompt_ids):
            raise RequestError(f"prompt token ids must be integers in [0, {self.vocab_size})", "prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt "
                f"has {len(prompt_ids)} tokens.",
                "messages",
            )
        if params.max_tokens is not None and params.max_tokens < 1:
            raise RequestError("max_tokens must be at least 1", "max_tokens")
        if params.logprobs:
            raise RequestError(
                "top_logprobs are not available from a Tinker sampler (the sampled tokens' logprobs are)",
                "top_logprobs",
            )

    def _sample(
        self,
        client: Any,
        version: str,
        prompt_ids: list[int],
        params: SamplingParams,
        on_token: Callable[[TokenEvent], None] | None,
    ) -> GenerationResult:
        from tinker import types

        room = self.max_model_len - len(prompt_ids)
        max_tokens = min(params.max_tokens or room, room)
        stop = [] if params.ignore_eos else list(self._eos_ids)
        request = types.SamplingParams(
            max_tokens=max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,
            seed=params.seed,
            stop=stop + list(params.stop_token_ids) or None,
        )
        response = client.sample(
            prompt=types.ModelInput.from_ints(prompt_ids), num_samples=1, sampling_params=request
        ).result(timeout=self._timeout)
        sequence = response.sequences[0]
        tokens, logprobs = list(sequence.tokens), [float(v) for v in (sequence.logprobs or [])]
        finish = "stop" if sequence.stop_reason == "stop" else "length"
        tokens, logprobs, finish = self._cut_at_stop_string(tokens, logprobs, finish, params.stop)
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        for s in params.stop:
            if s in text:
                text = text[: text.find(s)]
        if on_token is not None:
            for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=False)):
                on_token(TokenEvent(token, logprob, None, i == len(tokens) - 1))
        return GenerationResult(
            prompt_token_ids=prompt_ids,
            token_ids=tokens,
            logprobs=logprobs,
            top_logprobs=None,
            text=text,
            finish_reason=finish,
            model_version=version,
        )

    def _cut_at_stop_string(
        self, tokens: list[int], logprobs: list[float], finish: str, stops: list[str]
    ) -> tuple[list[int], list[float], str]:
        """Keep tokens up to the one that completes a stop string (as the local engine stops there)."""
        if not stops:
            return tokens, logprobs, finish
        for end in range(1, len(tokens) + 1):
            if any(s in self.tokenizer.decode(tokens[:end], skip_special_tokens=True) for s in stops):
                return tokens[:end], logprobs[:end], "stop"
        return tokens, logprobs, finish


def _eos_ids(model_dir: Path, config: dict[str, Any], tokenizer: Any) -> set[int]:
    """End-of-sequence ids from the model config, ``generation_config.json`` and the tokenizer
    (the ids the local engine stops on)."""
    ids: set[int] = set()
    sources = [config.get("eos_token_id")]
    generation = model_dir / "generation_config.json"
    if generation.is_file():
        sources.append(json.loads(generation.read_text()).get("eos_token_id"))
    if tokenizer.eos_token_id is not None:
        sources.append(tokenizer.eos_token_id)
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids
