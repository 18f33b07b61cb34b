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
    InvalidInputError,
    InvalidTransitionError,
    NotFoundError,
)
from agentgrad.store.protocol import RolloutRequest
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
)

#: The store service's bearer token, when none is passed: ``agentgrad store serve`` and every
#: ``StoreClient`` read it, so runners join a protected service without the token on their
#: command line (where ``ps`` would show it) and runner processes inherit it.
TOKEN_ENV = "AGENTGRAD_STORE_TOKEN"

#: The longest a single long-poll request (dequeue, wait) blocks on the server, in seconds.
MAX_WAIT_SECONDS = 60.0

#: Header carrying a client-chosen key that makes a retried write return the first answer.
IDEMPOTENCY_HEADER = "Idempotency-Key"

#: Error kind (the ``error`` field of every error body) → HTTP status and exception class.
ERROR_KINDS: dict[str, tuple[int, type[AgentGradError]]] = {
    "not_found": (404, NotFoundError),
    "invalid_transition": (409, InvalidTransitionError),
    "already_exists": (409, AlreadyExistsError),
    "invalid_input": (400, InvalidInputError),
    "validation_error": (422, InvalidInputError),
}
KIND_OF_ERROR: dict[type[AgentGradError], str] = {
    NotFoundError: "not_found",
    InvalidTransitionError: "invalid_transition",
    AlreadyExistsError: "already_exists",
    InvalidInputError: "invalid_input",
}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Query(BaseModel):
    """Query-string parameters; unknown ones are ignored, as web frameworks do."""


class RolloutQuery(_Query):
    rollout_id: str


class SpanQuery(_Query):
    rollout_id: str
    attempt_id: str | None = Field(None, description='an attempt id, or "latest"')
    name: str | None = None
    after_sequence_id: int = 0
    limit: int | None = Field(None, ge=0)


class ResourcesQuery(_Query):
    resources_id: str


class MetricQuery(_Query):
    run_id: str | None = None


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
    limit: int = 1
    worker_id: str | None = None
    #: Seconds to wait for a first rollout; the server caps one request at MAX_WAIT_SECONDS.
    timeout: float = Field(default=0.0, ge=0)


class ClaimList(BaseModel):
    claimed: list[AttemptedRollout]


class RolloutRef(_Body):
    rollout_id: str


class MetadataBody(_Body):
    rollout_id: str
    metadata: dict[str, Any]


class WaitBody(_Body):
    rollout_ids: list[str]
    #: None waits the server's maximum; the client repeats until its own deadline.
    timeout: float | None = Field(default=None, ge=0)


class Count(BaseModel):
    count: int


class AttemptList(BaseModel):
    attempts: list[Attempt]


class AttemptRef(_Body):
    rollout_id: str
    attempt_id: str


class AttemptUpdateBody(AttemptRef):
    #: Plain text, validated by the store so an unknown status is refused like a local call.
    status: str = Field(json_schema_extra={"enum": [s.value for s in AttemptStatus]})
    error: AttemptError | None = None


class SpanList(BaseModel):
    spans: list[Span]


class SpanReceipt(BaseModel):
    """The answer of the bulk span endpoint: what the client needs to rebuild the stored copies
    without the service sending every span back (most of a batch's bytes and decoding time).

    A new span's stored copy is the span as sent, numbered; only repeats whose first stored copy
    differs from what was sent come back whole.
    """

    sequence_ids: list[int]
    stored: dict[int, Span] = Field(default_factory=dict, description="by index in the batch: stored "
                                    "copies that differ from the span sent (repeats of an earlier span)")


class ResourcesBody(_Body):
    items: dict[str, Any]
    resources_id: str | None = None


class ResourcesList(BaseModel):
    resources: list[Resources]


class LatestResources(BaseModel):
    resources: Resources | None


class WorkerList(BaseModel):
    workers: list[Worker]


class MetricList(BaseModel):
    records: list[MetricRecord]
