"""The ``/v1`` endpoints of the store service: one per Store method, as data.

Each :class:`Endpoint` names its method and path, the wire models of its input and answer, and
the function that calls the store. :mod:`agentgrad.store.service.api` serves this table and
:mod:`agentgrad.store.service.openapi` documents it, so what runs and what ``/openapi.json`` describes
come from the same place.

Ids travel in bodies and query strings, never in paths (see :mod:`agentgrad.store.wire`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel

from agentgrad.store import wire
from agentgrad.store.protocol import RolloutFilter, Store
from agentgrad.types import Attempt, AttemptStatus, Resources, Rollout, Span, Worker


@dataclass(frozen=True)
class Context:
    """What the endpoints reach: the store, the cap on one long poll, the span counter, and the
    request's ``Idempotency-Key`` (set per request for ``replayable`` endpoints, passed to the
    store, which records the answer with the write)."""

    store: Store
    max_wait: float
    count_spans: Callable[[int], None]
    idempotency_key: str | None = None

    def wait_limit(self, timeout: float | None) -> float:
        """A requested long-poll wait, capped at ``max_wait``; None asks for the cap."""
        return self.max_wait if timeout is None else min(timeout, self.max_wait)


@dataclass(frozen=True)
class Endpoint:
    """One store operation over HTTP.

    ``call(ctx, input)`` runs the store method; ``input`` is the validated ``body`` (JSON) or
    ``query`` (query string) model, or None when the endpoint takes neither. A ``response`` of
    None means 204 No Content. ``replayable`` writes honour ``Idempotency-Key`` (it reaches them
    as ``ctx.idempotency_key``); ``blocks`` says whether a given input long-polls (such calls get
    their own thread pool). ``heavy`` reads answer with a share of the store that grows with it
    (pages of spans, lists of rollouts, metrics): they run in a worker thread even where quick
    calls run on the event loop, so a long read never holds up heartbeats and claims.
    """

    method: str
    path: str
    tag: str
    call: Callable[[Context, Any], BaseModel | None]
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    replayable: bool = False
    blocks: Callable[[Context, Any], bool] | None = None
    heavy: bool = False


def _long_polls(ctx: Context, body: wire.DequeueBody | wire.WaitBody) -> bool:
    return ctx.wait_limit(body.timeout) > 0


# ---- rollouts -----------------------------------------------------------------------------------


def enqueue_rollouts(ctx: Context, body: wire.EnqueueBody) -> wire.RolloutList:
    """Queue rollouts atomically (all or none). Send ``Idempotency-Key`` to make retries safe."""
    return wire.RolloutList(rollouts=ctx.store.enqueue_rollouts(body.rollouts, idempotency_key=ctx.idempotency_key))


def dequeue_rollouts(ctx: Context, body: wire.DequeueBody) -> wire.ClaimList:
    """Claim up to ``limit`` rollouts, long-polling up to ``timeout`` seconds for the first."""
    wait = ctx.wait_limit(body.timeout)
    return wire.ClaimList(
        claimed=ctx.store.dequeue_rollouts(
            body.limit, worker_id=body.worker_id, timeout=wait, idempotency_key=ctx.idempotency_key
        )
    )


def get_rollout(ctx: Context, query: wire.RolloutQuery) -> Rollout:
    """The rollout, or 404."""
    return ctx.store.get_rollout(query.rollout_id)


def query_rollouts(ctx: Context, body: RolloutFilter) -> wire.RolloutList:
    """Rollouts matching the filter, sorted and paged."""
    return wire.RolloutList(rollouts=ctx.store.query_rollouts(body))


def count_rollouts(ctx: Context, body: RolloutFilter) -> wire.Count:
    """How many rollouts match the filter (ignoring its paging)."""
    return wire.Count(count=ctx.store.count_rollouts(body))


def cancel_rollout(ctx: Context, body: wire.RolloutRef) -> Rollout:
    """Cancel a rollout that has not finished."""
    return ctx.store.cancel_rollout(body.rollout_id, idempotency_key=ctx.idempotency_key)


def update_rollout_metadata(ctx: Context, body: wire.MetadataBody) -> Rollout:
    """Merge metadata into the rollout's metadata."""
    return ctx.store.update_rollout_metadata(body.rollout_id, body.metadata)


def wait_for_rollouts(ctx: Context, body: wire.WaitBody) -> wire.RolloutList:
    """The listed rollouts that are terminal, long-polling up to ``timeout`` seconds."""
    return wire.RolloutList(
        rollouts=ctx.store.wait_for_rollouts(body.rollout_ids, timeout=ctx.wait_limit(body.timeout))
    )


# ---- attempts -----------------------------------------------------------------------------------


def get_attempts(ctx: Context, query: wire.RolloutQuery) -> wire.AttemptList:
    """Every attempt of the rollout, oldest first."""
    return wire.AttemptList(attempts=ctx.store.get_attempts(query.rollout_id))


def update_attempt(ctx: Context, body: wire.AttemptUpdateBody) -> Attempt:
    """Move an attempt to a new status; ``spans`` of the attempt are stored with the change, in
    its transaction (all or nothing)."""
    attempt = ctx.store.update_attempt(
        body.rollout_id, body.attempt_id, cast(AttemptStatus, body.status), body.error, spans=body.spans
    )  # the store checks it
    ctx.count_spans(len(body.spans))
    return attempt


def heartbeat(ctx: Context, body: wire.AttemptRef) -> Attempt:
    """Record that the attempt's runner is alive."""
    return ctx.store.heartbeat(body.rollout_id, body.attempt_id)


def check_watchdog(ctx: Context, _: None) -> wire.AttemptList:
    """Run one watchdog sweep now; returns the attempts it ended."""
    return wire.AttemptList(attempts=ctx.store.check_watchdog())


# ---- spans --------------------------------------------------------------------------------------


def _store_spans(ctx: Context, body: wire.SpanList) -> list[Span]:
    stored = ctx.store.add_spans(body.spans)
    ctx.count_spans(len(stored))
    return stored


def add_spans(ctx: Context, body: wire.SpanList) -> wire.SpanList:
    """Store spans idempotently on (rollout_id, attempt_id, span_id); returns stored copies."""
    return wire.SpanList(spans=_store_spans(ctx, body))


def add_spans_receipt(ctx: Context, body: wire.SpanList) -> wire.SpanReceipt:
    """Store spans like ``POST /v1/spans``, answering with their sequence ids instead of whole
    spans (what ``StoreClient`` uses: the bulk path)."""
    stored = _store_spans(ctx, body)
    differing = {
        index: copy
        for index, (sent, copy) in enumerate(zip(body.spans, stored, strict=True))
        if copy.__dict__ != {**sent.__dict__, "sequence_id": copy.sequence_id}
    }
    # A stored span always carries its sequence id.
    return wire.SpanReceipt(sequence_ids=cast(list[int], [copy.sequence_id for copy in stored]), stored=differing)


def query_spans(ctx: Context, query: wire.SpanQuery) -> wire.SpanPage:
    """One page of a rollout's spans (one attempt, or ``latest``), in sequence order: at most
    ``limit`` spans after ``after_sequence_id``; ``next_after_sequence_id`` says where the next
    page starts, null when this is the last."""
    spans = ctx.store.query_spans(
        query.rollout_id, query.attempt_id, query.name, query.after_sequence_id, query.limit + 1
    )  # one more than asked: whether a next page exists
    if len(spans) <= query.limit:
        return wire.SpanPage(spans=spans, next_after_sequence_id=None)
    del spans[query.limit :]
    return wire.SpanPage(
        spans=spans, next_after_sequence_id=spans[-1].sequence_id if spans else query.after_sequence_id
    )


# ---- resources ----------------------------------------------------------------------------------


def add_resources(ctx: Context, body: wire.ResourcesBody) -> Resources:
    """Store a new resources snapshot (the next version)."""
    return ctx.store.add_resources(body.items, body.resources_id, idempotency_key=ctx.idempotency_key)


def query_resources(ctx: Context, _: None) -> wire.ResourcesList:
    """Every resources snapshot, oldest first."""
    return wire.ResourcesList(resources=ctx.store.query_resources())


def get_latest_resources(ctx: Context, _: None) -> wire.LatestResources:
    """The highest-version snapshot, or null."""
    return wire.LatestResources(resources=ctx.store.get_latest_resources())


def get_resources(ctx: Context, query: wire.ResourcesQuery) -> Resources:
    """One snapshot, or 404."""
    return ctx.store.get_resources(query.resources_id)


# ---- workers and metrics ------------------------------------------------------------------------


def update_worker(ctx: Context, body: Worker) -> Worker:
    """Create or update a worker's record."""
    return ctx.store.update_worker(body)


def query_workers(ctx: Context, _: None) -> wire.WorkerList:
    """Every worker's record."""
    return wire.WorkerList(workers=ctx.store.query_workers())


def add_metrics(ctx: Context, body: wire.MetricList) -> None:
    """Store training metric records."""
    ctx.store.add_metrics(body.records, idempotency_key=ctx.idempotency_key)


def query_metrics(ctx: Context, query: wire.MetricQuery) -> wire.MetricList:
    """Metric records, of one run or all."""
    return wire.MetricList(records=ctx.store.query_metrics(query.run_id))


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/rollouts/enqueue",
        "rollouts",
        enqueue_rollouts,
        body=wire.EnqueueBody,
        response=wire.RolloutList,
        replayable=True,
    ),
    Endpoint(
        "POST",
        "/v1/rollouts/dequeue",
        "rollouts",
        dequeue_rollouts,
        body=wire.DequeueBody,
        response=wire.ClaimList,
        replayable=True,
        blocks=_long_polls,
    ),
    Endpoint("GET", "/v1/rollouts/get", "rollouts", get_rollout, query=wire.RolloutQuery, response=Rollout),
    Endpoint(
        "POST",
        "/v1/rollouts/query",
        "rollouts",
        query_rollouts,
        body=RolloutFilter,
        response=wire.RolloutList,
        heavy=True,
    ),
    Endpoint(
        "POST", "/v1/rollouts/count", "rollouts", count_rollouts, body=RolloutFilter, response=wire.Count, heavy=True
    ),
    Endpoint(
        "POST",
        "/v1/rollouts/cancel",
        "rollouts",
        cancel_rollout,
        body=wire.RolloutRef,
        response=Rollout,
        replayable=True,
    ),
    Endpoint(
        "POST", "/v1/rollouts/metadata", "rollouts", update_rollout_metadata, body=wire.MetadataBody, response=Rollout
    ),
    Endpoint(
        "POST",
        "/v1/rollouts/wait",
        "rollouts",
        wait_for_rollouts,
        body=wire.WaitBody,
        response=wire.RolloutList,
        blocks=_long_polls,
    ),
    Endpoint("GET", "/v1/attempts", "attempts", get_attempts, query=wire.RolloutQuery, response=wire.AttemptList),
    Endpoint("POST", "/v1/attempts/update", "attempts", update_attempt, body=wire.AttemptUpdateBody, response=Attempt),
    Endpoint("POST", "/v1/attempts/heartbeat", "attempts", heartbeat, body=wire.AttemptRef, response=Attempt),
    Endpoint("POST", "/v1/watchdog/check", "attempts", check_watchdog, response=wire.AttemptList),
    Endpoint("POST", "/v1/spans", "spans", add_spans, body=wire.SpanList, response=wire.SpanList),
    Endpoint("POST", "/v1/spans/receipt", "spans", add_spans_receipt, body=wire.SpanList, response=wire.SpanReceipt),
    Endpoint("GET", "/v1/spans", "spans", query_spans, query=wire.SpanQuery, response=wire.SpanPage, heavy=True),
    Endpoint(
        "POST",
        "/v1/resources",
        "resources",
        add_resources,
        body=wire.ResourcesBody,
        response=Resources,
        replayable=True,
    ),
    Endpoint("GET", "/v1/resources", "resources", query_resources, response=wire.ResourcesList, heavy=True),
    Endpoint("GET", "/v1/resources/latest", "resources", get_latest_resources, response=wire.LatestResources),
    Endpoint("GET", "/v1/resources/get", "resources", get_resources, query=wire.ResourcesQuery, response=Resources),
    Endpoint("POST", "/v1/workers", "workers", update_worker, body=Worker, response=Worker),
    Endpoint("GET", "/v1/workers", "workers", query_workers, response=wire.WorkerList, heavy=True),
    Endpoint("POST", "/v1/metrics", "metrics", add_metrics, body=wire.MetricList, replayable=True),
    Endpoint(
        "GET", "/v1/metrics", "metrics", query_metrics, query=wire.MetricQuery, response=wire.MetricList, heavy=True
    ),
)
