"""In-process inference engine over Hugging Face transformers, with continuous batching.

Why our own engine: training needs the exact token ids and logprobs that were sampled, and a
versioned policy whose weights can be swapped while agents keep calling it. vLLM does this on a
GPU; this engine does it everywhere else (and in every test) for any ``AutoModelForCausalLM``.

Design:

* One background thread owns the model. Requests are queued; each step the thread admits
  waiting requests (prefilled together, left-padded) into the running batch and then decodes one
  token for every running sequence in a single forward pass (continuous batching). Finished
  sequences leave the batch at once, so short requests never wait for long ones.
* Logprobs are those of the model's raw distribution (temperature 1, no top-p/top-k), like
  vLLM's default ``raw_logprobs``: the same quantity a trainer recomputes from the weights.
* Weight updates are "drain then swap": once an update is requested, no new sequence is
  admitted; running sequences finish on the old weights (their responses name the old version);
  then the weights are replaced and admission resumes, so every response comes from exactly one
  version. LoRA adapters are loaded and unloaded between steps without draining; a request picks
  an adapter by name, and different adapters share one batch (peft mixed-adapter batches). A
  response from an adapter names the adapter as its version (a trainer publishing LoRA policies
  loads each under a new name), one from the base weights their version.
* Prompt prefixes are computed once (``prefix_caching``, on by default): the requests admitted
  together run the prefix they share in one row, identical prompts (a GRPO group) run once, and
  the states of shared prefixes and of whole prompts stay in a :class:`PrefixCache` for later
  requests (least recently used out first, ``prefix_cache_mb`` at most), dropped when the
  weights they came from change.
* The batch's key-value cache grows in place (:mod:`agentgrad.inference.batch_cache`): a decode
  step writes its token into free positions instead of copying the whole cache, as
  transformers' ``DynamicCache`` does with ``torch.cat``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgrad.inference.hf import no_progress_bars, quiet_peft
from agentgrad.inference.kv_cache import cache_kwargs
from agentgrad.inference.prefix_cache import DEFAULT_CACHE_MB, Layers, PrefixCache, check_cache_mb, common_length

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch

#: The fewest shared prompt tokens worth a forward pass of their own (one row, before the rest).
MIN_SHARED_TOKENS = 16


class EngineError(RuntimeError):
    """The engine could not serve a request (closed, or the model failed)."""


class RequestError(ValueError):
    """A request the engine refuses; ``param`` names the offending field (OpenAI-style)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    """How to sample one sequence. ``temperature == 0`` means greedy.

    ``max_tokens`` None: up to the context limit. ``logprobs`` None: none returned; k >= 0: the
    sampled token's logprob plus the k most likely alternatives.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None


@dataclass
class TokenEvent:
    """One sampled token, delivered to a streaming callback from the engine thread."""

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] | None
    finished: bool


@dataclass
class GenerationResult:
    """What one sequence produced, and the weights (and adapter) that produced it."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None
    text: str
    finish_reason: str  # "stop" | "length"
    model_version: str
    lora: str | None = None


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    lora: str | None
    future: Future
    on_token: Callable[[TokenEvent], None] | None
    generator: Any = None


@dataclass
class _Seq:
    request: _Request
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class _Control:
    kind: str  # "update" | "load_lora" | "unload_lora"
    payload: Any
    future: Future


#: A probe tool: a chat template "renders tools" when this name shows up in its output.
_PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "agentgrad_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template renders a request's tools (a probe tool's name
    appears in the rendered prompt). False without a template: a template with no tool section
    silently drops ``tools``, and the model never sees them."""
    if not getattr(tokenizer, "chat_template", None):
        return False
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # noqa: BLE001 - a template that cannot render tools does not render them
        return False
    return _PROBE_TOOL["function"]["name"] in str(text)


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors from a HF model directory (safetensors or .bin shards) or a single weights file."""
    import torch
    from safetensors.torch import load_file

    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.safetensors")) or sorted(p.glob("pytorch_model*.bin"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {p}")
    elif p.is_file():
        files = [p]
    else:
        raise FileNotFoundError(f"weights path {p} does not exist")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        if f.suffix == ".safetensors":
            state.update(load_file(str(f)))
        else:
            state.update(torch.load(str(f), map_location="cpu", weights_only=True))
    return state


class Engine:
    """Owns a causal LM and serves ``generate`` calls from many threads, batched together.

    ``model`` is a model directory (anything ``AutoModelForCausalLM.from_pretrained`` loads) or an
    already loaded model, in which case ``tokenizer`` must be given too. ``prefix_caching``
    computes a prompt prefix once for the requests that share it and keeps the states of up to
    ``prefix_cache_mb`` megabytes of prefixes for later requests (0: share only within the
    requests admitted together); off, every prompt is prefilled whole, as before.
    """

    def __init__(
        self,
        model: str | Path | Any,
        *,
        tokenizer: Any = None,
        device: str = "cpu",
        dtype: str | None = None,
        max_batch_size: int = 32,
        max_model_len: int | None = None,
        version: str = "v0",
        seed: int = 0,
        prefix_caching: bool = True,
        prefix_cache_mb: float = DEFAULT_CACHE_MB,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        check_cache_mb(prefix_cache_mb)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if isinstance(model, (str, Path)):
            self.model_dir: Path | None = Path(model)
            torch_dtype = getattr(torch, dtype) if dtype else (torch.float32 if device == "cpu" else "auto")
            with no_progress_bars():
                model = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch_dtype)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(self.model_dir))
        else:
            self.model_dir = None
            if tokenizer is None:
                raise ValueError("tokenizer is required when passing a loaded model")
        self.tokenizer = tokenizer
        self._renders_tools: bool | None = None
        self._base = model.to(self.device).eval()  # type: ignore[arg-type]  # transformers' own stubs for .to
        self._model = self._base
        self._loras: dict[str, str] = {}
        self.max_batch_size = max_batch_size
        config_len = getattr(model.config, "max_position_embeddings", None) or 2048
        self.max_model_len = min(max_model_len or config_len, config_len)
        self._version = version
        self._versions = itertools.count(1)
        self._eos_ids = self._collect_eos_ids()
        self._rng = torch.Generator(device="cpu").manual_seed(seed)
        self._prefixes = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_caching else None
        self._prefill_tokens = 0
        self._reused_tokens = 0
        self._pending: queue.Queue[_Request | _Control | None] = queue.Queue()
        self._closed = False
        self._steps = 0
        self._thread = threading.Thread(target=self._loop, name="agentgrad-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public API

    @property
    def model_version(self) -> str:
        """The version of the weights new requests will run on (after any pending update)."""
        return self._version

    @property
    def renders_tools(self) -> bool:
        """Whether the tokenizer's chat template renders a request's tools (see
        :func:`template_renders_tools`); the server refuses tools when it does not."""
        if self._renders_tools is None:
            self._renders_tools = template_renders_tools(self.tokenizer)
        return self._renders_tools

    @property
    def loras(self) -> list[str]:
        """Names of the loaded LoRA adapters."""
        return sorted(self._loras)

    @property
    def forward_steps(self) -> int:
        """How many decode/prefill forward passes ran: fewer than tokens means batching worked."""
        return self._steps

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the engine ran forward passes over."""
        return self._prefill_tokens

    @property
    def reused_prompt_tokens(self) -> int:
        """Prompt tokens whose states came from a shared or cached prefix instead of a forward
        pass: with :attr:`prefill_tokens`, every prompt token admitted."""
        return self._reused_tokens

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        lora: str | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> Future:
        """Queue a generation; the returned future resolves to a :class:`GenerationResult`.

        ``on_token`` is called from the engine thread for every sampled token (for streaming);
        it must be quick and must not raise.
        """
        import torch

        params = params or SamplingParams()
        self._validate(prompt_ids, params, lora)
        if self._closed:
            raise EngineError("engine is closed")
        generator = None
        if params.seed is not None and params.temperature > 0:
            generator = torch.Generator(device="cpu").manual_seed(int(params.seed))
        request = _Request(list(prompt_ids), params, lora, Future(), on_token, generator)
        self._pending.put(request)
        return request.future

    def generate(
        self, prompt_ids: list[int], params: SamplingParams | None = None, *, lora: str | None = None
    ) -> GenerationResult:
        """Blocking :meth:`submit`: generate from ``prompt_ids`` and wait for the result."""
        return self.submit(prompt_ids, params, lora=lora).result()

    def update_weights(self, weights: dict[str, Any] | str | Path, version: str | None = None) -> str:
        """Replace the base model's weights (a state dict, a weights file or a model directory).

        Keys are the base model's ``state_dict`` names; a partial dict updates only those
        tensors. Unknown keys or shape mismatches raise ``ValueError`` before anything changes.
        Running requests finish on the old weights first (see module doc). Returns the new
        version: ``version`` or the next ``v<N>``.
        """
        state = load_state_dict(weights) if isinstance(weights, (str, Path)) else dict(weights)
        if not state:
            raise ValueError("weights: empty state dict")
        return self._control("update", (state, version))

    def load_lora(self, name: str, path: str | Path) -> None:
        """Load a peft LoRA adapter from ``path``; requests whose model is ``name`` then use it."""
        if not name or name == BASE_ADAPTER:
            raise ValueError(f"lora name {name!r} is not allowed")
        if not Path(path).is_dir():
            raise FileNotFoundError(f"LoRA adapter directory {path} does not exist")
        self._control("load_lora", (name, str(path)))

    def unload_lora(self, name: str) -> None:
        """Unload adapter ``name``; requests already running on it finish first."""
        if name not in self._loras:
            raise KeyError(f"lora {name!r} is not loaded")
        self._control("unload_lora", name)

    def close(self) -> None:
        """Stop the engine thread; queued and running requests fail with :class:`EngineError`."""
        if self._closed:
            return
        self._closed = True
        self._pending.put(None)
        self._thread.join(timeout=30)
        while True:  # anything that raced past the closed check
            try:
                item = self._pending.get_nowait()
            except queue.Empty:
                break
            if item is not None and not item.future.done():
                item.future.set_exception(EngineError("engine is closed"))

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- helpers

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (getattr(self._base, "generation_config", None), self._base.config):
            value = getattr(source, "eos_token_id", None) if source is not None else None
            if isinstance(value, int):
                ids.add(value)
            elif value:
                ids.update(int(v) for v in value)
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def _validate(self, prompt_ids: list[int], params: SamplingParams, lora: str | None) -> None:
        vocab = self._base.config.vocab_size
        if not prompt_ids:
            raise RequestError("prompt is empty", "prompt")
        if any(not isinstance(t, int) or t < 0 or t >= vocab for t in prompt_ids):
            raise RequestError(f"prompt token ids must be integers in [0, {vocab})", "prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(prompt_ids)} tokens.",
                "messages",
            )
        if params.max_tokens is not None:
            if params.max_tokens < 1:
                raise RequestError("max_tokens must be at least 1", "max_tokens")
            if len(prompt_ids) + params.max_tokens > self.max_model_len:
                raise RequestError(
                    f"This model's maximum context length is {self.max_model_len} tokens; you requested "
                    f"{len(prompt_ids)} prompt + {params.max_tokens} completion tokens.",
                    "max_tokens",
                )
        if params.temperature < 0:
            raise RequestError("temperature must be >= 0", "temperature")
        if not 0 < params.top_p <= 1:
            raise RequestError("top_p must be in (0, 1]", "top_p")
        if params.top_k < 0:
            raise RequestError("top_k must be >= 0 (0 disables it)", "top_k")
        if params.logprobs is not None and not 0 <= params.logprobs <= 20:
            raise RequestError("top_logprobs must be between 0 and 20", "top_logprobs")
        if lora is not None and lora not in self._loras:
            raise RequestError(f"lora {lora!r} is not loaded", "model")

    def _control(self, kind: str, payload: Any) -> Any:
        if self._closed:
            raise EngineError("engine is closed")
        control = _Control(kind, payload, Future())
        self._pending.put(control)
        return control.future.result()

    # ---------------------------------------------------------------- engine thread

    def _loop(self) -> None:
        import torch

        waiting: list[_Request] = []
        controls: list[_Control] = []
        batch = _Batch(self)
        while True:
            block = not waiting and not batch.seqs and not controls
            items: list[_Request | _Control | None] = []
            try:
                items.append(self._pending.get(timeout=0.05) if block else self._pending.get_nowait())
                while True:
                    items.append(self._pending.get_nowait())
            except queue.Empty:
                pass
            if any(i is None for i in items) or self._closed:
                queued = [i for i in items if isinstance(i, _Request)]
                self._fail_all(waiting + queued + [s.request for s in batch.seqs], EngineError("engine is closed"))
                for c in controls + [i for i in items if isinstance(i, _Control)]:
                    c.future.set_exception(EngineError("engine is closed"))
                return
            for item in items:
                (controls if isinstance(item, _Control) else waiting).append(item)  # type: ignore[arg-type]
            try:
                with torch.inference_mode():
                    controls = self._apply_controls(controls, batch)
                    draining = any(c.kind == "update" for c in controls)
                    unloading = {c.payload for c in controls if c.kind == "unload_lora"}
                    if not draining:
                        admit = [r for r in waiting if r.lora not in unloading][: self.max_batch_size - len(batch.seqs)]
                        if admit:
                            waiting = [r for r in waiting if r not in admit]
                            batch.admit(admit)
                    if batch.seqs:
                        batch.step()
            except Exception as exc:  # the model failed: fail what was running, keep serving
                log.exception("engine step failed")
                self._fail_all([s.request for s in batch.seqs], EngineError(f"generation failed: {exc}"))
                batch = _Batch(self)

    def _fail_all(self, requests: list[_Request], exc: Exception) -> None:
        for r in requests:
            if not r.future.done():
                r.future.set_exception(exc)

    def _apply_controls(self, controls: list[_Control], batch: _Batch) -> list[_Control]:
        """Apply what can be applied now; return the controls that must wait for a drain."""
        remaining = []
        for control in controls:
            busy_loras = {s.request.lora for s in batch.seqs}
            if control.kind == "update" and batch.seqs:
                remaining.append(control)
                continue
            if control.kind == "unload_lora" and control.payload in busy_loras:
                remaining.append(control)
                continue
            try:
                control.future.set_result(getattr(self, f"_do_{control.kind}")(control.payload))
            except Exception as exc:
                control.future.set_exception(exc)
        return remaining

    def _do_update(self, payload: tuple[dict[str, Any], str | None]) -> str:
        import torch

        state, version = payload
        params = {}
        for name, tensor in itertools.chain(
            self._base.named_parameters(remove_duplicate=False), self._base.named_buffers(remove_duplicate=False)
        ):
            if "lora_" in name:
                continue
            params[name.replace(".base_layer.", ".")] = tensor
        unknown = [k for k in state if k not in params]
        if unknown:
            raise ValueError(f"weights: unknown parameter names {unknown[:5]}")
        bad = [k for k, v in state.items() if tuple(v.shape) != tuple(params[k].shape)]
        if bad:
            raise ValueError(f"weights: shape mismatch for {bad[:5]}")
        with torch.no_grad():
            for key, value in state.items():
                params[key].copy_(value.to(device=params[key].device, dtype=params[key].dtype))
        self._version = version or f"v{next(self._versions)}"
        if self._prefixes is not None:
            self._prefixes.clear()
        log.info("weights updated to version %s (%d tensors)", self._version, len(state))
        return self._version

    def _do_load_lora(self, payload: tuple[str, str]) -> None:
        from peft import PeftModel

        name, path = payload
        if self._model is self._base:
            with quiet_peft():
                self._model = PeftModel.from_pretrained(self._base, path, adapter_name=name).eval()
        else:
            if name in self._loras:
                self._model.delete_adapter(name)
            self._model.load_adapter(path, adapter_name=name)
            self._model.eval()
        self._loras[name] = path
        if self._prefixes is not None:
            self._prefixes.forget(name)

    def _do_unload_lora(self, name: str) -> None:
        del self._loras[name]
        if self._prefixes is not None:
            self._prefixes.forget(name)
        if self._loras:
            with quiet_peft():
                self._model.delete_adapter(name)
        else:
            self._base = self._model.unload()
            self._model = self._base


def _draw(logits: torch.Tensor, params: list[SamplingParams], draws: list[float]) -> torch.Tensor:
    """One token per row of ``logits``, sampled under each row's temperature, top-k and top-p,
    at the row's uniform draw in [0, 1): the token whose cumulative probability interval holds it."""
    import torch

    device = logits.device
    scaled = logits / torch.tensor([p.temperature for p in params], device=device, dtype=logits.dtype)[:, None]
    vocab = scaled.shape[-1]
    ks = [min(p.top_k, vocab) for p in params]
    if any(ks):  # the k-th largest value of each row that asks for top-k; -inf (keep all) elsewhere
        index = torch.tensor([max(k, 1) - 1 for k in ks], device=device)[:, None]
        kth = torch.topk(scaled, max(ks)).values.gather(1, index)
        kth = kth.masked_fill(torch.tensor([k == 0 for k in ks], device=device)[:, None], float("-inf"))
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if any(p.top_p < 1.0 for p in params):
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=probs.dtype)[:, None]
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # the mass of the likelier tokens
        kept = torch.where((before < top_p) | (top_p >= 1.0), sorted_probs, 0.0)
        probs = torch.zeros_like(probs).scatter(1, order, kept)
    cdf = probs.double().cumsum(-1)
    at = torch.tensor(draws, device=device, dtype=cdf.dtype)[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, at, right=True)[:, 0].clamp(max=vocab - 1)


class _Batch:
    """The running sequences and their shared, left-padded KV cache (engine thread only)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.seqs: list[_Seq] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, loras: list[str | None]
    ) -> torch.Tensor:
        engine = self.engine
        kwargs: dict[str, Any] = {}
        if engine._model is not engine._base:
            kwargs["adapter_names"] = [name or BASE_ADAPTER for name in loras]
        out = engine._model(
            input_ids=ids.to(engine.device),
            attention_mask=mask.to(engine.device),
            position_ids=positions.to(engine.device),
            use_cache=True,
            **cache_kwargs(cache),
            logits_to_keep=1,
            **kwargs,
        )
        engine._steps += 1
        return out.logits[:, -1, :].float()

    def admit(self, requests: list[_Request]) -> None:
        """Prefill ``requests`` and merge them into the running batch (an adapter's requests
        together, when prefixes are shared: a prefix's states belong to one adapter)."""
        if self.engine._prefixes is None:
            groups = [requests]
        else:
            groups = [[r for r in requests if r.lora == lora] for lora in dict.fromkeys(r.lora for r in requests)]
        for group in groups:
            cache, mask, logits = self._prefill(group)
            new = [_Seq(r) for r in group]
            if not self.seqs:
                self.cache, self.mask = cache, mask
            else:
                self._merge(cache, mask)
            self.seqs.extend(new)
            self._sample(new, logits)
        self._retire()

    def _prefill(self, group: list[_Request]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """The cache, mask and last logits of ``group``'s prompts, reusing what prefixes allow.

        Identical prompts run once. The prefix all prompts share runs once, in one row, when it
        is :data:`MIN_SHARED_TOKENS` or more beyond what the engine's :class:`PrefixCache`
        already holds, and is kept there; a lone prompt is kept whole. Each row's cache then
        reads ``[shared prefix][left padding][the row's own tokens]``: attention follows the
        mask and the positions, so the hole changes nothing."""
        engine = self.engine
        prefixes = engine._prefixes
        total = sum(len(r.prompt_ids) for r in group)
        if prefixes is None:
            out = self._run([r.prompt_ids for r in group], [r.lora for r in group], [], 0)
            engine._prefill_tokens += total
            return out
        from agentgrad.inference.batch_cache import states

        lora = group[0].lora
        row_of: dict[tuple[int, ...], int] = {}
        rows = [row_of.setdefault(tuple(r.prompt_ids), len(row_of)) for r in group]
        unique = [list(prompt) for prompt in row_of]
        shared = min(min(common_length(unique[0], p) for p in unique), min(len(p) for p in unique) - 1)
        layers, start = prefixes.longest(lora, unique[0], shared)
        ran = 0
        if len(unique) > 1 and shared - start >= MIN_SHARED_TOKENS:
            layers = self._extend(layers, unique[0], start, shared, lora)
            prefixes.add(lora, unique[0][:shared], layers)
            ran, start = shared - start, shared
        cache, mask, logits = self._run(unique, [lora] * len(unique), layers, start)
        if len(unique) == 1 and len(unique[0]) - start >= MIN_SHARED_TOKENS:
            prefixes.add(lora, unique[0], states(cache))
        ran += sum(len(p) - start for p in unique)
        engine._prefill_tokens += ran
        engine._reused_tokens += total - ran
        if len(rows) > len(unique):  # a prompt sent more than once: its row repeated
            import torch

            index = torch.tensor(rows)
            for layer in cache.layers:
                layer.keep(index, 0)
            mask, logits = mask[index], logits[index.to(logits.device)]
        return cache, mask, logits

    def _extend(self, layers: Layers, tokens: list[int], start: int, end: int, lora: str | None) -> Layers:
        """The states of ``tokens[:end]``, given those of ``tokens[:start]``: one row's forward pass."""
        import torch

        from agentgrad.inference.batch_cache import batch_cache, states

        cache = batch_cache(layers, 1)
        ids = torch.tensor([tokens[start:end]])
        self._forward(ids, torch.ones((1, end), dtype=torch.long), torch.arange(start, end)[None], cache, [lora])
        return states(cache)

    def _run(
        self, prompts: list[list[int]], loras: list[str | None], layers: Layers, start: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """One forward pass over each prompt's tokens from ``start`` on, left-padded, after the
        states ``layers`` of the ``start`` tokens all prompts share."""
        import torch

        from agentgrad.inference.batch_cache import batch_cache

        width = max(len(p) - start for p in prompts)
        pad = self.engine.tokenizer.pad_token_id or 0
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        own = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) + start :] = torch.tensor(prompt[start:])
            own[row, width - len(prompt) + start :] = 1
        positions = start + (own.cumsum(-1) - 1).clamp(min=0)
        mask = torch.cat([torch.ones((len(prompts), start), dtype=torch.long), own], dim=1)
        cache = batch_cache(layers, len(prompts))
        logits = self._forward(ids, mask, positions, cache, loras)
        return cache, mask, logits

    def _merge(self, cache: Any, mask: torch.Tensor) -> None:
        import torch
        import torch.nn.functional as F

        assert self.mask is not None
        old_len, new_len = self.mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.stack(theirs, width)
        self.mask = torch.cat([F.pad(self.mask, (width - old_len, 0)), F.pad(mask, (width - new_len, 0))])

    def step(self) -> None:
        """Decode one token for every running sequence in one forward pass."""
        import torch

        assert self.mask is not None
        ids = torch.tensor([[s.out_ids[-1]] for s in self.seqs])
        positions = torch.tensor([[len(s.request.prompt_ids) + len(s.out_ids) - 1] for s in self.seqs])
        self.mask = torch.cat([self.mask, torch.ones((len(self.seqs), 1), dtype=torch.long)], dim=1)
        logits = self._forward(ids, self.mask, positions, self.cache, [s.request.lora for s in self.seqs])
        self._sample(self.seqs, logits)
        self._retire()

    def _sample(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        """Pick each row's next token, on the engine's device, for all rows at once.

        Row by row this cost ~1.3 ms a sequence on the host (a softmax and a draw over the whole
        vocabulary each), which on a GPU was most of a decode step (128 sequences of a 49k-token
        vocabulary: ~390 tokens/s on an H100). Now the only per-row host work is one uniform draw
        from the request's own generator (so a seeded request stays reproducible) and reading
        back the chosen ids and logprobs. A row samples by inverting its cumulative distribution
        at that draw, which picks each token with its probability after temperature, top-k and
        top-p, as ``torch.multinomial`` did."""
        import torch

        logprobs_all = torch.log_softmax(logits, dim=-1)
        tokens = torch.argmax(logits, dim=-1)
        params = [seq.request.params for seq in seqs]
        sampled = [row for row, p in enumerate(params) if p.temperature != 0]
        if sampled:
            generators = [seqs[row].request.generator or self.engine._rng for row in sampled]
            draws = [float(torch.rand((), generator=generator)) for generator in generators]
            rows = torch.tensor(sampled, device=logits.device)
            tokens[rows] = _draw(logits[rows], [params[row] for row in sampled], draws)
        chosen = logprobs_all.gather(1, tokens[:, None])[:, 0]
        ids, logprobs = tokens.tolist(), chosen.tolist()
        k = max((p.logprobs or 0) for p in params)
        if k:
            values, indices = torch.topk(logprobs_all, k)
            top_values, top_ids = values.tolist(), indices.tolist()
        for row, (seq, p) in enumerate(zip(seqs, params, strict=True)):
            seq.out_ids.append(ids[row])
            seq.logprobs.append(logprobs[row])
            top = None
            if p.logprobs:
                top = list(zip(top_ids[row][: p.logprobs], top_values[row][: p.logprobs], strict=True))
                seq.top.append(top)
            elif p.logprobs == 0:
                seq.top.append([])
            seq.finish_reason = self._finish_reason(seq)
            if seq.request.on_token is not None:
                seq.request.on_token(TokenEvent(seq.out_ids[-1], seq.logprobs[-1], top, seq.finish_reason is not None))

    def _finish_reason(self, seq: _Seq) -> str | None:
        p, token = seq.request.params, seq.out_ids[-1]
        if (token in self.engine._eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            return "stop"
        if p.stop:
            window = max(len(s) for s in p.stop) + 8
            tail = self.engine.tokenizer.decode(seq.out_ids[-window:], skip_special_tokens=True)
            if any(s in tail for s in p.stop):
                return "stop"
        total = len(seq.request.prompt_ids) + len(seq.out_ids)
        if (p.max_tokens is not None and len(seq.out_ids) >= p.max_tokens) or total >= self.engine.max_model_len:
            return "length"
        return None

    def _retire(self) -> None:
        """Resolve finished sequences, drop their rows, and trim padding no row needs."""
        import torch

        done = [s for s in self.seqs if s.finish_reason is not None]
        if not done:
            return
        for seq in done:
            self._resolve(seq)
        keep = [i for i, s in enumerate(self.seqs) if s.finish_reason is None]
        self.seqs = [self.seqs[i] for i in keep]
        if not self.seqs:
            self.cache, self.mask = None, None
            return
        assert self.mask is not None
        index = torch.tensor(keep)
        self.mask = self.mask[index]
        start = int(self.mask.argmax(dim=1).min())  # first real token of the longest row
        self.mask = self.mask[:, start:]
        for layer in self.cache.layers:
            layer.keep(index, start)

    def _resolve(self, seq: _Seq) -> None:
        engine, p = self.engine, seq.request.params
        text = engine.tokenizer.decode(seq.out_ids, skip_special_tokens=True)
        if p.stop:
            cut = min((text.find(s) for s in p.stop if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        result = GenerationResult(
            prompt_token_ids=seq.request.prompt_ids,
            token_ids=seq.out_ids,
            logprobs=seq.logprobs,
            top_logprobs=seq.top if p.logprobs is not None else None,
            text=text,
            finish_reason=seq.finish_reason or "stop",
            model_version=seq.request.lora or engine._version,  # an adapter is its own version
            lora=seq.request.lora,
        )
        if not seq.request.future.done():
            seq.request.future.set_result(result)
