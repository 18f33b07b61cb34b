"""The JSON shapes of the store service, shared by the server (validation, OpenAPI) and the client
(response parsing), so the two cannot drift apart: request bodies, query strings, responses.

Ids travel in bodies and query strings, never in URL paths: rollout and resources ids are free
text chosen by users, and a ``/`` or ``%2F`` in a path segment would be decoded by the server
before routing.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentgrad.errors import (
    AgentGradError,
    AlreadyExistsError,
    IdempotencyKeyReusedError,
    InvalidInputError,
    InvalidTransitionError,
    NotFoundError,
)
from agentgrad.store.protocol import RolloutRequest
from agentgrad.types import (
    INT64_MAX,
    Attempt,
    AttemptedRollout,
    AttemptError,
    AttemptStatus,
    Key,
    MetricRecord,
    Name,
    Resources,
    Rollout,
    Span,
    StoredInt,
    Worker,
)

#: The store service's bearer token, when none is passed: ``agentgrad store serve`` and every
#: ``StoreClient`` read it, so runners join a protected service without the token on their
#: command line (where ``ps`` would show it) and runner processes inherit it.
TOKEN_ENV = "AGENTGRAD_STORE_TOKEN"

#: The longest a single long-poll request (dequeue, wait) blocks on the server, in seconds.
MAX_WAIT_SECONDS = 60.0

#: Spans per answer of ``GET /v1/spans`` when the request names no ``limit``, and the most one
#: request may ask for. A rollout's spans are read page by page (``after_sequence_id``), so one
#: read never holds the service, or its memory, for the whole of a long rollout.
DEFAULT_SPAN_PAGE = 1000
MAX_SPAN_PAGE = 5000

#: Header carrying a client-chosen key that makes a retried write return the first answer (the
#: rules: :mod:`agentgrad.store.idempotency`).
IDEMPOTENCY_HEADER = "Idempotency-Key"

#: Error kind (the ``error`` field of every error body) → HTTP status and exception class.
ERROR_KINDS: dict[str, tuple[int, type[AgentGradError]]] = {
    "not_found": (404, NotFoundError),
    "invalid_transition": (409, InvalidTransitionError),
    "already_exists": (409, AlreadyExistsError),
    "invalid_input": (400, InvalidInputError),
    "validation_error": (422, InvalidInputError),
    "idempotency_key_reused": (422, IdempotencyKeyReusedError),
}
KIND_OF_ERROR: dict[type[AgentGradError], str] = {
    NotFoundError: "not_found",
    InvalidTransitionError: "invalid_transition",
    AlreadyExistsError: "already_exists",
    InvalidInputError: "invalid_input",
    IdempotencyKeyReusedError: "idempotency_key_reused",
}


class _Body(BaseModel):
    """A request body: unknown fields and non-finite numbers (``NaN``, ``Infinity``) are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Query(BaseModel):
    """Query-string parameters; unknown ones are ignored, as web frameworks do."""


class RolloutQuery(_Query):
    rollout_id: Key


class SpanQuery(_Query):
    rollout_id: Key
    attempt_id: Key | None = Field(None, description='an attempt id, or "latest"')
    name: Name | None = None
    after_sequence_id: StoredInt = Field(
        0, description="answer the spans after this sequence id (the previous page's next_after_sequence_id)"
    )
    limit: int = Field(DEFAULT_SPAN_PAGE, ge=0, le=MAX_SPAN_PAGE, description="spans per page")


class SpanPage(BaseModel):
    """One page of a rollout's spans, in sequence order."""

    spans: list[Span]
    next_after_sequence_id: int | None = Field(
        None, description="where the next page starts (pass it as after_sequence_id); null on the last page"
    )


class ResourcesQuery(_Query):
    resources_id: Key


class MetricQuery(_Query):
    run_id: Key | None = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: a stable ``error`` kind, a message naming the problem, and the
    exception's own fields (e.g. ``current``/``requested`` of a refused transition)."""

    error: str
    message: str
    fields: dict[str, Any] = Field(default_factory=dict)


class EnqueueBody(_Body):
    rollouts: list[RolloutRequest]


class RolloutList(BaseModel):
    rollouts: list[Rollout]


class DequeueBody(_Body):
    limit: int = Field(1, le=INT64_MAX)
    worker_id: Key | None = None
    #: Seconds to wait for a first rollout; the server caps one request at MAX_WAIT_SECONDS.
    timeout: float = Field(default=0.0, ge=0)


class ClaimList(BaseModel):
    claimed: list[AttemptedRollout]


class RolloutRef(_Body):
    rollout_id: Key


class MetadataBody(_Body):
    rollout_id: Key
    metadata: dict[str, Any]


class WaitBody(_Body):
    rollout_ids: list[Key]
    #: None waits the server's maximum; the client repeats until its own deadline.
    timeout: float | None = Field(default=None, ge=0)


class Count(BaseModel):
    count: int


class AttemptList(BaseModel):
    attempts: list[Attempt]


class AttemptRef(_Body):
    rollout_id: Key
    attempt_id: Key


class AttemptUpdateBody(AttemptRef):
    #: Plain text, validated by the store so an unknown status is refused like a local call.
    status: str = Field(json_schema_extra={"enum": [s.value for s in AttemptStatus]})
    error: AttemptError | None = None
    #: Spans of the attempt stored with the change, in its transaction (a reward with a success).
    spans: list[Span] = []


class SpanList(BaseModel):
    spans: list[Span]


class SpanReceipt(BaseModel):
    """The answer of the bulk span endpoint: what the client needs to rebuild the stored copies
    without the service sending every span back (most of a batch's bytes and decoding time).

    A new span's stored copy is the span as sent, numbered; only repeats whose first stored copy
    differs from what was sent come back whole.
    """

    sequence_ids: list[int]
    stored: dict[int, Span] = Field(
        default_factory=dict,
        description="by index in the batch: stored copies that differ from the span sent (repeats of an earlier span)",
    )


class ResourcesBody(_Body):
    items: dict[str, Any]
    resources_id: Key | None = None


class ResourcesList(BaseModel):
    resources: list[Resources]


class LatestResources(BaseModel):
    resources: Resources | None


class WorkerList(BaseModel):
    workers: list[Worker]


class MetricList(BaseModel):
    records: list[MetricRecord]
