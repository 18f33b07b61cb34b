"""A local policy's lifetime in one object: the engine, its model server, and the capture proxy.

Training a local model needs three running pieces, started in this order and closed in the
reverse one: the inference :class:`~agentgrad.inference.engine.Engine` (the weights the trainer
swaps), the OpenAI-compatible :class:`~agentgrad.inference.server.ModelServer` in front of it, and
the capture :class:`~agentgrad.proxy.server.LLMProxy` that records every call into the store::

    with LocalPolicy("path/to/model").serving(store) as policy:
        Trainer(store, algorithm=GRPO(policy.model_dir), policy=policy).fit(agent, tasks)

The :class:`~agentgrad.trainer.Trainer` points its runners at :attr:`LocalPolicy.proxy_url`,
publishes :meth:`LocalPolicy.llm` as the agent's LLM resource, and hands the policy to the
algorithm (``context.policy``), which publishes new weights through :meth:`LocalPolicy.publisher`.
Given a policy that is not started, the Trainer starts it on its own store and closes it after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgrad.inference.prefix_cache import DEFAULT_CACHE_MB, check_cache_mb
from agentgrad.types import LLM

if TYPE_CHECKING:
    from agentgrad.inference.engine import Engine
    from agentgrad.inference.server import ModelServer
    from agentgrad.proxy.server import LLMProxy
    from agentgrad.store.protocol import Store
    from agentgrad.training.backend import Publisher
    from agentgrad.training.publish import LocalEnginePublisher


#: The engine weights' dtypes :class:`LocalPolicy` takes (None: float32 on a CPU, the model's own on a GPU).
ENGINE_DTYPES = (None, "float32", "bfloat16")

#: The Python call that gives the directory of each model the command line names (``--model tiny``),
#: for the error a name given to :class:`LocalPolicy` gets; the same names as the CLI's
#: ``agentgrad.cli.named_models.NAMED_MODELS`` (a test keeps them equal).
NAMED_MODEL_CALLS = {
    "tiny": "agentgrad.demo.tiny.ensure_tiny_model()",
    "tiny-sql": "agentgrad.scenarios.sql.model.ensure_sql_model()",
    "tiny-rag": "agentgrad.scenarios.rag.model.ensure_rag_model()",
    "smollm2": "agentgrad.models.gguf_import.import_smollm2()",
}


class LocalPolicy:
    """A local Hugging Face causal LM served for rollouts and trained in place.

    Args:
        model_dir: a local model directory (``config.json``, weights, tokenizer).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or ``"auto"``.
        dtype: the engine's weights: ``"float32"`` or ``"bfloat16"``; None: float32 on a CPU, the
            model's own on a GPU. On a CPU with native bf16 instructions (AVX512-BF16, AMX)
            ``"bfloat16"`` decodes several times faster (docs/training.md, "Mixed precision"); its
            sampled logprobs then differ from a float32 trainer's by a few hundredths.
        max_batch_size: sequences the engine decodes together.
        prefix_caching: compute a prompt prefix the engine's requests share once, and keep the
            states of recent prefixes for later requests (docs/inference.md, "Prefix caching");
            False prefills every prompt whole.
        prefix_cache_mb: megabytes of prefix states kept for later requests (0: shared only among
            the requests admitted together).
        served_model_name: the model name agents are given (default: the directory's name).
        proxy_host, proxy_port: where the capture proxy listens (default: a free port on
            127.0.0.1); runner processes on other machines need ``proxy_host="0.0.0.0"`` and a
            known port, to name in ``agentgrad runner --proxy``.
        lora_hot_swap: publish a LoRA policy by loading its adapter into the engine under a new
            model name instead of copying the merged weights (see
            :class:`~agentgrad.training.publish.LocalEnginePublisher` for the trade-off).

    Nothing runs until :meth:`start` (or :meth:`serving`); :meth:`close` stops what runs and may
    be called any number of times.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: str | None = None,
        max_batch_size: int = 64,
        prefix_caching: bool = True,
        prefix_cache_mb: float = DEFAULT_CACHE_MB,
        served_model_name: str | None = None,
        proxy_host: str = "127.0.0.1",
        proxy_port: int = 0,
        lora_hot_swap: bool = False,
    ) -> None:
        path = Path(model_dir).expanduser()
        if not path.is_dir():
            what = "is not a directory" if path.exists() else "does not exist"
            call = NAMED_MODEL_CALLS.get(str(model_dir))
            hint = (
                f"; `{model_dir}` is the command line's name for a model the project builds or imports: in "
                f"Python pass its directory, {call}"
                if call is not None
                else ""
            )
            raise FileNotFoundError(
                f"LocalPolicy: the model directory {path} {what} "
                f"(a local Hugging Face model directory, with config.json and the weights){hint}"
            )
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"LocalPolicy: {path} has no config.json: it is not a Hugging Face model directory")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be ≥ 1, got {max_batch_size}")
        if dtype not in ENGINE_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(map(str, ENGINE_DTYPES))}, got {dtype!r}")
        check_cache_mb(prefix_cache_mb)
        self.model_dir = path
        self.device = device
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        self.prefix_caching, self.prefix_cache_mb = prefix_caching, prefix_cache_mb
        self.model_name = served_model_name or path.name
        self.proxy_host, self.proxy_port = proxy_host, proxy_port
        self.lora_hot_swap = lora_hot_swap
        self.store: Store | None = None
        self.engine: Engine | None = None
        self.server: ModelServer | None = None
        self.proxy: LLMProxy | None = None
        self._publisher: LocalEnginePublisher | None = None  # the latest publisher(): its adapter is the policy
        #: The model server's OpenAI base URL (``http://127.0.0.1:PORT/v1``), once started.
        self.upstream_url: str | None = None
        #: The capture proxy's root URL (``http://127.0.0.1:PORT``, what ``agentgrad runner --proxy``
        #: takes), once started.
        self.proxy_url: str | None = None

    # ---- lifetime -------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self.proxy is not None

    def start(self, store: Store) -> LocalPolicy:
        """Start the engine, the model server and the proxy recording into ``store``; returns self.

        Starting again on the same store does nothing; on another store it is an error. If a
        piece fails to start, the ones already started are closed before the error propagates.
        """
        if self.started:
            if store is not self.store:
                raise RuntimeError(f"LocalPolicy({self.model_dir}) is already serving another store; close it first")
            return self
        from agentgrad.runner import check_not_bootstrapping

        check_not_bootstrapping("LocalPolicy.start()")
        from agentgrad.inference.server import ModelServer
        from agentgrad.proxy.server import LLMProxy

        self._check_model()
        try:
            self.engine = self._make_engine()
            self.server = ModelServer(self.engine, served_model_name=self.model_name)
            self.upstream_url = self.server.start()
            proxy = LLMProxy(store, self.upstream_url, host=self.proxy_host, port=self.proxy_port)
            proxy.start()
            self.proxy, self.proxy_url, self.store = proxy, proxy.url, store
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop the proxy (its span writer drains), the model server, then the engine (idempotent)."""
        proxy, server, engine = self.proxy, self.server, self.engine
        self.proxy = self.server = self.engine = None
        self._publisher = None
        self.store = self.upstream_url = self.proxy_url = None
        try:
            if proxy is not None:
                proxy.stop()
        finally:
            try:
                if server is not None:
                    server.stop()
            finally:
                if engine is not None:
                    engine.close()

    def _check_model(self) -> None:
        """Name a missing tokenizer or chat template before anything loads."""
        from agentgrad.training.policy import check_model

        check_model(self.model_dir)

    def _make_engine(self) -> Engine:
        """The engine the model server serves (a subclass serves another one: the Tinker sampler)."""
        from agentgrad.inference.engine import Engine

        return Engine(
            self.model_dir,
            device=self.device,
            dtype=self.dtype,
            max_batch_size=self.max_batch_size,
            prefix_caching=self.prefix_caching,
            prefix_cache_mb=self.prefix_cache_mb,
        )

    @contextlib.contextmanager
    def serving(self, store: Store) -> Iterator[LocalPolicy]:
        """``with policy.serving(store) as policy:`` — started on ``store`` for the block, then closed."""
        self.start(store)
        try:
            yield self
        finally:
            self.close()

    def __enter__(self) -> LocalPolicy:
        """``with LocalPolicy(dir).start(store) as policy:`` — closed at the end of the block."""
        self._require_started("with LocalPolicy(...)")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- what the Trainer and the algorithm use --------------------------------------------------
    def llm(self, **sampling: Any) -> LLM:
        """The LLM resource for agents: the model server's endpoint and model name, with ``sampling``
        (``temperature=…``). Runners given the proxy rewrite the endpoint per attempt."""
        self._require_started("LocalPolicy.llm()")
        model = (self._publisher.model if self._publisher is not None else None) or self.model_name
        return LLM(endpoint=self.upstream_url, model=model, sampling=sampling)  # type: ignore[arg-type]

    def publisher(self) -> Publisher:
        """Publishes new weights into this policy's engine (drain, then swap); with
        ``lora_hot_swap``, a LoRA adapter is loaded under a new model name, which :meth:`llm` names
        from then on."""
        from agentgrad.training.publish import LocalEnginePublisher

        engine = self._require_started("LocalPolicy.publisher()")
        self._publisher = LocalEnginePublisher(engine, lora_hot_swap=self.lora_hot_swap)
        return self._publisher

    @property
    def model_version(self) -> str:
        """The version of the weights the engine serves to new requests (``v0`` at start)."""
        return self._require_started("LocalPolicy.model_version").model_version

    def _require_started(self, what: str) -> Engine:
        if self.engine is None or not self.started:
            raise RuntimeError(
                f"{what}: the policy is not started — use `with LocalPolicy(dir).serving(store) "
                "as policy:` or give it to a Trainer, which starts it on its store"
            )
        return self.engine

    def __repr__(self) -> str:
        state = f"serving {self.upstream_url} behind {self.proxy_url}" if self.started else "not started"
        return f"LocalPolicy({str(self.model_dir)!r}, {state})"
