"""What the proxy's routes share: the store, the upstream client, counters, retry memory.

``ProxyState`` is built once per proxy app; :class:`Call` is one client request on its way
through it (the relay of a streamed answer takes the call over from the route).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agentgrad.http.upstream import Upstream, UpstreamUnreachable
from agentgrad.proxy.capture import Api, CallContext, Capture, Requested, build_span
from agentgrad.proxy.metrics import ProxyMetrics
from agentgrad.proxy.writer import SpanWriter

if TYPE_CHECKING:
    from agentgrad.store.protocol import Store
    from agentgrad.types import Span

log = logging.getLogger(__name__)

RecordMode = Literal["async", "sync"]
_RETRIES_REMEMBERED = 4096
#: A name the upstream did not list re-reads its ``/models`` (the first time it is asked for, then
#: at most this often, in seconds): a trainer publishing LoRA policies serves each under a new name,
#: which must reach the engine, while a framework's fixed name ("gpt-4o-mini") must not cost a read
#: per call.
_MODELS_REFRESH_SECONDS = 1.0


class ProxyState:
    """Everything the routes share: the store, the upstream client, counters, retry memory."""

    def __init__(
        self,
        store: Store,
        upstream_url: str,
        *,
        model: str | None = None,
        upstream_api_key: str | None = None,
        forward_client_auth: bool = True,
        upstream_timeout: float = 600.0,
        record_mode: RecordMode = "async",
        write_linger: float = 0.0,
    ) -> None:
        if record_mode not in ("async", "sync"):
            raise ValueError(f"record_mode must be 'async' or 'sync', got {record_mode!r}")
        self.store = store
        self.record_mode = record_mode
        self.upstream_url = upstream_url.rstrip("/")
        self.model = model
        self.upstream_api_key = upstream_api_key
        #: False when the client's ``Authorization`` is the proxy's own token, never sent on.
        self.forward_client_auth = forward_client_auth
        self.upstream_timeout = upstream_timeout
        self.metrics = ProxyMetrics()
        self.writer = SpanWriter(store, self.metrics, linger=write_linger)
        self.client: Upstream | None = None
        self._served: list[str] | None = None
        self._unlisted: dict[str, float] = {}  # names not served, and when /models last said so
        self._recent: OrderedDict[tuple[str, str, bytes], str] = OrderedDict()

    # ---- upstream --------------------------------------------------------------------------------
    def http(self) -> Upstream:
        if self.client is None:  # created on the serving loop (lifespan), or lazily in tests
            self.client = Upstream(self.upstream_url, timeout=self.upstream_timeout)
        return self.client

    def headers(self, client: Mapping[str, str]) -> dict[str, str]:
        """The upstream request's headers, given the client's."""
        headers = {"content-type": "application/json"}
        auth: str | None
        if self.upstream_api_key:
            auth = f"Bearer {self.upstream_api_key}"
        else:
            auth = client.get("authorization") if self.forward_client_auth else None
        if auth:
            headers["authorization"] = auth
        return headers

    async def served_model(self, asked: Any) -> str | None:
        """The upstream model for a requested name: kept if served, else the first served model.

        Frameworks insist on names they know (LlamaIndex, CrewAI via env vars); the engine may
        serve any name. The list is read once, and again when a name not on it is asked for (the
        first time, then at most once a second per name): a LoRA policy published during training
        is served under a new name. If the upstream has no ``/models``, names pass as is.
        """
        if self.model is not None:
            return self.model
        now = time.monotonic()
        if self._served is None or (
            self._is_unlisted(asked)
            and now - self._unlisted.get(asked, -_MODELS_REFRESH_SECONDS) >= _MODELS_REFRESH_SECONDS
        ):
            try:
                response = await self.http().request("GET", "/models", headers=self.headers({}))
                body = await response.read()
                self._served = [m["id"] for m in json.loads(body)["data"]] if response.status_code == 200 else []
            except (UpstreamUnreachable, ValueError, KeyError, TypeError):
                self._served = []
            if self._is_unlisted(asked):
                if len(self._unlisted) > 1024:  # names are few; a client inventing names must not grow this
                    self._unlisted.clear()
                self._unlisted[asked] = now
        if not self._served or asked in self._served:
            return asked if isinstance(asked, str) else (self._served[0] if self._served else None)
        return self._served[0]

    def _is_unlisted(self, asked: Any) -> bool:
        """Whether ``asked`` is a name the upstream's last-read, non-empty ``/models`` did not list."""
        if not self._served:
            return False
        return isinstance(asked, str) and asked not in self._served

    # ---- capture ---------------------------------------------------------------------------------
    def span_id_for(self, context: CallContext, headers: Mapping[str, str], raw: bytes) -> str | None:
        """Reuse the span id of the first try when the openai SDK retries the same body.

        The store keeps the first copy of a span id, so a retry of a call that was already
        recorded (e.g. the client timed out reading it) does not count twice.
        """
        key = (context.rollout_id, context.attempt_id, hashlib.blake2b(raw, digest_size=16).digest())
        retry = headers.get("x-stainless-retry-count", "0")
        if retry not in ("", "0") and key in self._recent:
            self.metrics.retries_deduplicated += 1
            return self._recent[key]
        span_id = hashlib.blake2b(key[2] + time.time_ns().to_bytes(8, "little"), digest_size=8).hexdigest()
        self._recent[key] = span_id
        if len(self._recent) > _RETRIES_REMEMBERED:
            self._recent.popitem(last=False)
        return span_id

    def drop(self, call: Call) -> None:
        """The call ends without a span (error, aborted stream): release it from the flush barrier."""
        if call.key is not None and call.open:
            call.open = False
            self.writer.cancel(call.key)

    async def record(self, call: Call, answer: Callable[[], tuple[dict[str, Any], Capture]], *, streamed: bool) -> None:
        """Hand the call's span to the writer (``async``) or store it now (``sync``).

        ``answer`` gives the response as the client saw it and its capture; it is called where the
        span is built (the writer thread in ``async`` mode), so a passed-through answer is parsed there.
        """
        key, context = call.key, call.context
        if key is None or context is None or not call.open:
            return
        call.open = False
        ended = time.time()

        def make_span() -> Span:
            response, capture = answer()
            if capture.prompt_token_ids is None or capture.completion_token_ids is None:
                self.metrics.missing_token_ids += 1
                log.warning(
                    "upstream %s returned no token ids for a call of rollout %s: the call is stored but "
                    "cannot be trained on (does the engine support return_token_ids?)",
                    self.upstream_url,
                    context.rollout_id,
                )
            return build_span(
                context,
                call.api,
                call.body,
                response,
                capture,
                streamed=streamed,
                started=call.started,
                translated=call.chat if call.api == "responses" else None,
                span_id=call.span_id,
                ended=ended,
            )

        if self.record_mode == "async":
            self.writer.submit(key, make_span)
            return
        try:  # a SQL commit must not stall the loop
            await asyncio.to_thread(self.writer.write_now, key, make_span)
        except Exception:  # the agent still gets its answer; the writer counted and logged the loss
            return


@dataclass
class Call:
    """One client request on its way through the proxy."""

    api: Api
    body: dict[str, Any]
    chat: dict[str, Any]
    asked: Requested
    context: CallContext | None
    started: float
    span_id: str | None = None
    key: tuple[str, str] | None = None  # (rollout_id, attempt_id) of a recorded call
    open: bool = False  # accepted by the flush barrier, span not yet handed over
    streaming: bool = False  # the relayed stream's response owns the call from here
