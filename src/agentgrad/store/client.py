"""StoreClient: the store service seen through HTTP, and itself a :class:`Store`.

Callers cannot tell it from a local store: it takes the same arguments, validates them the same
way before sending, and raises the same exceptions (the server names the exception kind in every
error body). On top of that it survives a flaky network:

* connection errors, timeouts and 5xx answers are retried with exponential backoff; 4xx never;
* writes are safe to retry: ids (rollout, resources, span) are chosen here before sending, and
  every non-idempotent write carries an ``Idempotency-Key`` (the caller's ``idempotency_key``, or
  a fresh one per call, the same on each of its retries) so a retry after a lost response gets
  the first answer back (no duplicate enqueue, no second claim, no spurious AlreadyExists). The
  service records the answer in its database with the write, so this holds across its restarts;
* long waits (``dequeue_rollouts(timeout=…)``, ``wait_for_rollouts``) are server-side long
  polls, repeated until the caller's deadline — never client busy-polling.

One pool of HTTP/1.1 keep-alive connections serves every thread, the package's sync transport
(:func:`agentgrad.http.transport.transport_for`): the lean pool for plain ``http://`` URLs, an
``httpx.Client`` for ``https://``, for a proxy named by the environment, or when a custom httpx
transport is given.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import BaseModel, TypeAdapter

from agentgrad.errors import AgentGradError, InvalidInputError
from agentgrad.http.transport import transport_for
from agentgrad.store import wire
from agentgrad.store.core import evolved
from agentgrad.store.idempotency import check_key
from agentgrad.store.jsoncheck import normalize_json, normalized_spans
from agentgrad.store.protocol import RolloutFilter, RolloutRequest, Store
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptError,
    AttemptStatus,
    MetricRecord,
    Resources,
    Rollout,
    Span,
    Worker,
    new_id,
)

if TYPE_CHECKING:
    import httpx

M = TypeVar("M", bound=BaseModel)
_SPAN_LIST = TypeAdapter(list[Span])


class StoreServiceError(AgentGradError):
    """The service answered something a local store never would (401, 413, an unknown route…)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class StoreUnavailableError(StoreServiceError, ConnectionError):
    """The service could not be reached (or kept failing) after every retry."""


@functools.cache
def _dumps_as_fields(cls: type[BaseModel]) -> bool:
    """Whether ``model_dump()`` of ``cls`` is just its field values (no serializers, computed or
    excluded fields, extras or aliases): then JSON can encode the model's own ``__dict__``. That
    skips the intermediate copy ``model_dump`` builds, which was most of the client's time on a
    batch of spans."""
    decorators = cls.__pydantic_decorators__
    return not (
        decorators.field_serializers
        or decorators.model_serializers
        or decorators.computed_fields
        or cls.model_config.get("extra") == "allow"
        or cls.model_config.get("serialize_by_alias")
        or any(field.exclude or getattr(field, "exclude_if", None) for field in cls.model_fields.values())
    )


def _encode_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.__dict__ if _dumps_as_fields(type(value)) else value.model_dump()
    raise TypeError(f"value of type {type(value).__name__}")


def _encode(payload: dict[str, Any]) -> bytes:
    """JSON bytes of a request; refuses NaN/∞ and non-JSON values like a local store does
    (pydantic's own JSON mode would silently write ``null`` for NaN)."""
    try:
        return json.dumps(payload, allow_nan=False, default=_encode_default, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        for field, value in payload.items():
            normalize_json(_dump(value), field)  # raises InvalidInputError naming the exact path
        raise InvalidInputError(f"request is not JSON-serializable: {exc}") from None


def _dump(value: Any) -> Any:
    """Models → plain values (keeping whatever non-JSON values they hold, for ensure_json)."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _rebuild(cls: type[AgentGradError], message: str, fields: dict[str, Any]) -> AgentGradError:
    """The server's exception, same class, message and attributes, without re-running its
    constructor (whose signature differs per class)."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.__dict__.update(fields)
    return exc


class StoreClient(Store):
    """A :class:`Store` served by ``agentgrad store serve`` at ``url``.

    Args:
        url: the service's base URL, e.g. ``http://127.0.0.1:8765``.
        token: bearer token (the server's ``--token``); default: ``$AGENTGRAD_STORE_TOKEN``.
        timeout: seconds for one request (long polls get their wait on top).
        retries: extra tries after a connection error, timeout or 5xx (0 = none).
        backoff: first retry delay in seconds; doubles per try (with jitter), capped at 2 s.
        long_poll: longest single long-poll request; longer waits repeat it.
        transport: a custom httpx transport (TLS settings, proxies, fault injection in tests).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 5,
        backoff: float = 0.05,
        long_poll: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.token = token if token is not None else os.environ.get(wire.TOKEN_ENV) or None
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.long_poll = min(long_poll, wire.MAX_WAIT_SECONDS)
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._transport = transport_for(self.url, headers=headers, timeout=timeout, httpx_transport=transport)

    # ---- transport ------------------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | bytes | None = None,
        *,
        params: dict[str, Any] | None = None,
        once: bool = False,
        key: str | None = None,
        wait: float = 0.0,
    ) -> bytes:
        """Send one request with retries; returns the body of a 2xx answer, raises otherwise.

        ``payload`` is the JSON body, as values to encode or already encoded.

        ``once`` marks a non-idempotent write: it carries an Idempotency-Key (``key``, or a new
        one) that stays the same across retries, so the server runs it at most once.
        """
        content = payload if payload is None or isinstance(payload, bytes) else _encode(payload)
        headers = {wire.IDEMPOTENCY_HEADER: check_key(key) if key is not None else uuid.uuid4().hex} if once else None
        target = path
        if params:
            target += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        timeout = self.timeout + wait
        problem = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(2.0, self.backoff * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random()))
            try:
                status, body = self._transport.request(method, target, content, headers=headers, timeout=timeout)
            except OSError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if status < 400:
                return body
            if status < 500:
                raise self._error(status, body)
            problem = f"HTTP {status}: {self._message(body)}"
        raise StoreUnavailableError(
            f"store service {self.url} failed {self.retries + 1} time(s) on {method} {path}: {problem}"
        )

    @staticmethod
    def _message(body: bytes) -> str:
        try:
            return wire.ErrorBody.model_validate_json(body).message
        except ValueError:
            return body[:500].decode("utf-8", "replace")

    def _error(self, status: int, content: bytes) -> AgentGradError:
        try:
            body = wire.ErrorBody.model_validate_json(content)
        except ValueError:
            return StoreServiceError(f"HTTP {status}: {content[:500].decode('utf-8', 'replace')}", status)
        known = wire.ERROR_KINDS.get(body.error)
        if known is None:
            return StoreServiceError(f"HTTP {status} ({body.error}): {body.message}", status)
        _, cls = known
        return _rebuild(cls, body.message, body.fields if cls is not InvalidInputError else {})

    def _call(
        self, model: type[M], method: str, path: str, payload: dict[str, Any] | bytes | None = None, **options: Any
    ) -> M:
        return model.model_validate_json(self._request(method, path, payload, **options))

    # ---- rollouts -------------------------------------------------------------------------------
    def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest | dict[str, Any]], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        """Rollouts without an id get one here, so that even a retry the service cannot replay
        stores nothing twice; with the caller's ``idempotency_key`` they are sent as given, so
        that the caller's own repeat matches the first request, as with a local store."""
        parsed = [r if isinstance(r, RolloutRequest) else RolloutRequest.model_validate(r) for r in requests]
        named = (
            parsed
            if idempotency_key is not None
            else [r if r.rollout_id else r.model_copy(update={"rollout_id": new_id("ro")}) for r in parsed]
        )
        return self._call(
            wire.RolloutList, "POST", "/v1/rollouts/enqueue", {"rollouts": named}, once=True, key=idempotency_key
        ).rollouts

    def dequeue_rollouts(
        self, limit: int, worker_id: str | None = None, timeout: float = 0.0, *, idempotency_key: str | None = None
    ) -> list[AttemptedRollout]:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            wait = min(self.long_poll, max(0.0, deadline - time.monotonic()))
            claimed = self._call(
                wire.ClaimList,
                "POST",
                "/v1/rollouts/dequeue",
                {"limit": limit, "worker_id": worker_id, "timeout": wait},
                once=True,
                key=idempotency_key,
                wait=wait,
            ).claimed
            if claimed or time.monotonic() >= deadline:
                return claimed

    def get_rollout(self, rollout_id: str) -> Rollout:
        return self._call(Rollout, "GET", "/v1/rollouts/get", params={"rollout_id": rollout_id})

    def query_rollouts(self, filter: RolloutFilter | None = None) -> list[Rollout]:
        body = (filter or RolloutFilter()).model_dump(exclude_defaults=True)
        return self._call(wire.RolloutList, "POST", "/v1/rollouts/query", body).rollouts

    def count_rollouts(self, filter: RolloutFilter | None = None) -> int:
        body = (filter or RolloutFilter()).model_dump(exclude_defaults=True)
        return self._call(wire.Count, "POST", "/v1/rollouts/count", body).count

    def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        return self._call(
            Rollout, "POST", "/v1/rollouts/cancel", {"rollout_id": rollout_id}, once=True, key=idempotency_key
        )

    def update_rollout_metadata(self, rollout_id: str, metadata: dict[str, Any]) -> Rollout:
        return self._call(Rollout, "POST", "/v1/rollouts/metadata", {"rollout_id": rollout_id, "metadata": metadata})

    def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        ids = list(rollout_ids)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            left = self.long_poll if deadline is None else max(0.0, deadline - time.monotonic())
            wait = min(self.long_poll, left)
            done = self._call(
                wire.RolloutList, "POST", "/v1/rollouts/wait", {"rollout_ids": ids, "timeout": wait}, wait=wait
            ).rollouts
            if len(done) == len(ids) or (deadline is not None and time.monotonic() >= deadline):
                return done

    # ---- attempts -------------------------------------------------------------------------------
    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        return self._call(wire.AttemptList, "GET", "/v1/attempts", params={"rollout_id": rollout_id}).attempts

    def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | str,
        error: AttemptError | None = None,
        *,
        spans: Sequence[Span | dict[str, Any]] = (),
    ) -> Attempt:
        body: dict[str, Any] = {
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "status": status.value if isinstance(status, AttemptStatus) else status,
            "error": error,
        }
        if spans:  # only then: a service from before spans could be sent refuses the field
            body["spans"] = list(spans)
        return self._call(Attempt, "POST", "/v1/attempts/update", body)

    def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        return self._call(
            Attempt, "POST", "/v1/attempts/heartbeat", {"rollout_id": rollout_id, "attempt_id": attempt_id}
        )

    def check_watchdog(self) -> list[Attempt]:
        return self._call(wire.AttemptList, "POST", "/v1/watchdog/check").attempts

    # ---- spans ----------------------------------------------------------------------------------
    def add_spans(self, spans: Sequence[Span | dict[str, Any]]) -> list[Span]:
        """Normalized here exactly as a local store does it, so the JSON sent (written by
        pydantic's serializer: nothing left in the spans needs checking) round-trips to these
        very spans, and the service answers with sequence ids only (see ``wire.SpanReceipt``)."""
        parsed = normalized_spans(spans)
        if not parsed:
            return []
        body = b'{"spans":' + _SPAN_LIST.dump_json(parsed) + b"}"
        receipt = self._call(wire.SpanReceipt, "POST", "/v1/spans/receipt", body)
        return [
            receipt.stored.get(index) or evolved(span, sequence_id=sequence_id)
            for index, (span, sequence_id) in enumerate(zip(parsed, receipt.sequence_ids, strict=True))
        ]

    def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
    ) -> list[Span]:
        """Read page by page (``wire.DEFAULT_SPAN_PAGE`` spans per request, or what is left of
        ``limit``, at most ``wire.MAX_SPAN_PAGE``) until ``limit`` spans or the last page: no single
        request asks the service for the whole of a long rollout. ``"latest"`` is pinned to the
        attempt of the first page, so the pages of one call never mix two attempts."""
        spans: list[Span] = []
        after = max(0, after_sequence_id)
        while True:
            want = wire.DEFAULT_SPAN_PAGE if limit is None else min(wire.MAX_SPAN_PAGE, max(0, limit - len(spans)))
            params = {
                "rollout_id": rollout_id,
                "attempt_id": attempt_id,
                "name": name,
                "after_sequence_id": after,
                "limit": want,
            }
            page = self._call(wire.SpanPage, "GET", "/v1/spans", params=params)
            spans += page.spans
            if page.next_after_sequence_id is None or (limit is not None and len(spans) >= limit):
                return spans
            if attempt_id == "latest" and page.spans:
                attempt_id = page.spans[0].attempt_id
            after = page.next_after_sequence_id

    # ---- resources ------------------------------------------------------------------------------
    def add_resources(
        self, items: dict[str, Any], resources_id: str | None = None, *, idempotency_key: str | None = None
    ) -> Resources:
        # Validated here like a local store does (same pydantic errors), then sent typed; named
        # here unless the caller's key makes its repeats match (see enqueue_rollouts).
        snapshot = Resources(resources_id=resources_id or new_id("res"), version=0, items=items)
        body = {
            "items": snapshot.items,
            "resources_id": resources_id if idempotency_key is not None else snapshot.resources_id,
        }
        return self._call(Resources, "POST", "/v1/resources", body, once=True, key=idempotency_key)

    def get_resources(self, resources_id: str) -> Resources:
        return self._call(Resources, "GET", "/v1/resources/get", params={"resources_id": resources_id})

    def get_latest_resources(self) -> Resources | None:
        return self._call(wire.LatestResources, "GET", "/v1/resources/latest").resources

    def query_resources(self) -> list[Resources]:
        return self._call(wire.ResourcesList, "GET", "/v1/resources").resources

    # ---- workers and metrics --------------------------------------------------------------------
    def update_worker(self, worker: Worker | dict[str, Any]) -> Worker:
        worker = worker if isinstance(worker, Worker) else Worker.model_validate(worker)
        return self._call(Worker, "POST", "/v1/workers", worker.model_dump())

    def query_workers(self) -> list[Worker]:
        return self._call(wire.WorkerList, "GET", "/v1/workers").workers

    def add_metrics(
        self, records: Sequence[MetricRecord | dict[str, Any]], *, idempotency_key: str | None = None
    ) -> None:
        parsed = [r if isinstance(r, MetricRecord) else MetricRecord.model_validate(r) for r in records]
        self._request("POST", "/v1/metrics", {"records": parsed}, once=True, key=idempotency_key)

    def query_metrics(self, run_id: str | None = None) -> list[MetricRecord]:
        return self._call(wire.MetricList, "GET", "/v1/metrics", params={"run_id": run_id}).records

    # ---- lifecycle ------------------------------------------------------------------------------
    @property
    def shared_url(self) -> str:
        return self.url

    def close(self) -> None:
        self._transport.close()

    def __repr__(self) -> str:
        return f"StoreClient({self.url!r})"
