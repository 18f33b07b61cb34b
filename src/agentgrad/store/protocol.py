"""The Store protocol: the single source of truth every component talks through.

The API is synchronous on purpose: it is fast in-process (SQLite, memory), trivially wrapped by
the HTTP service (``asyncio.to_thread``) and callable from any runner, thread or notebook. Every
backend — memory, SQLite, PostgreSQL and the HTTP client — implements exactly this class and
passes the same conformance suite (``tests/store/``).

Semantics shared by all backends
--------------------------------
* Queue: FIFO by enqueue time; a requeued rollout goes to the back of the queue.
* ``dequeue_rollout`` claims a queued rollout, creates attempt ``sequence_id = n + 1`` in status
  ``preparing`` and moves the rollout to ``preparing``. A claim is exclusive: no two callers ever
  receive the same attempt.
* ``update_attempt`` moves an attempt along preparing → running → succeeded | failed | timeout |
  unresponsive. Only the latest attempt drives the rollout. A terminal attempt whose reason is in
  ``config.retry_on`` and that still has attempts left requeues the rollout (``requeuing``);
  otherwise the rollout ends ``failed``. Every terminal status sets ``end_time``.
* The watchdog (``check_watchdog``, also run periodically by local stores) marks an active latest
  attempt ``timeout`` when ``timeout_seconds`` passed since it started, or ``unresponsive`` when
  ``unresponsive_seconds`` passed since its last heartbeat (or start).
* Heartbeats come from ``heartbeat`` *and* from every span added to an attempt. The first span
  of a ``preparing`` attempt moves it (and the rollout) to ``running``.
* Spans are idempotent on ``(rollout_id, attempt_id, span_id)``; the store issues a per-rollout
  ``sequence_id`` (1, 2, …) on first insert and returns the stored copy on repeats.
* Resources are immutable snapshots; ``version`` increases by one per snapshot; the latest is the
  highest version.
* Idempotency keys: the writes whose repeat would do something twice (``enqueue_rollouts``,
  ``dequeue_rollouts``, ``cancel_rollout``, ``add_resources``, ``add_metrics``) take an optional
  ``idempotency_key``. A call with a key the store has recorded for that operation does nothing
  and returns the first call's answer, also after a restart (the record is written in the
  write's own transaction); the same key with a different request is refused. The rules, the
  key's size and how long records are kept: :mod:`agentgrad.store.idempotency`.
* Unknown ids raise :class:`~agentgrad.errors.NotFoundError`; forbidden status changes raise
  :class:`~agentgrad.errors.InvalidTransitionError`; refused input raises
  :class:`~agentgrad.errors.InvalidInputError`. A refused call changes nothing.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptError,
    AttemptStatus,
    Key,
    MetricRecord,
    Name,
    Resources,
    Rollout,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    StoredInt,
    Worker,
)

RolloutSortKey = Literal["enqueue_time", "start_time", "end_time", "rollout_id", "status", "reward"]


class RolloutRequest(BaseModel):
    """One rollout to enqueue (the batch form of :meth:`Store.enqueue_rollout`)."""

    model_config = ConfigDict(extra="forbid")

    input: Any = None
    mode: RolloutMode = "train"
    resources_id: Key | None = None
    config: RolloutConfig = Field(default_factory=RolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    rollout_id: Key | None = None


class RolloutFilter(BaseModel):
    """Filters, ordering and paging for :meth:`Store.query_rollouts`."""

    model_config = ConfigDict(extra="forbid")

    status: list[RolloutStatus] | None = None
    mode: RolloutMode | None = None
    rollout_ids: list[Key] | None = None
    group_id: Name | None = None
    resources_id: Key | None = None
    #: Only rollouts that finished with no captured LLM call.
    no_llm_calls: bool | None = None
    sort_by: RolloutSortKey = "enqueue_time"
    descending: bool = False
    limit: StoredInt | None = None
    offset: StoredInt = 0


class Store(abc.ABC):
    """Tasks, attempts, spans, resources, workers and metrics in one place."""

    # ---- rollouts -------------------------------------------------------------------------
    def enqueue_rollout(
        self,
        input: Any = None,
        *,
        mode: RolloutMode = "train",
        resources_id: str | None = None,
        config: RolloutConfig | None = None,
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Rollout:
        """Queue one task. ``input`` must be JSON-serializable (refused naming the field)."""
        request = RolloutRequest(
            input=input,
            mode=mode,
            resources_id=resources_id,
            config=config or RolloutConfig(),
            metadata=metadata or {},
            rollout_id=rollout_id,
        )
        return self.enqueue_rollouts([request], idempotency_key=idempotency_key)[0]

    @abc.abstractmethod
    def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        """Queue many tasks atomically: all are stored, or none (on any refused input)."""

    def dequeue_rollout(
        self, worker_id: str | None = None, timeout: float = 0.0, *, idempotency_key: str | None = None
    ) -> AttemptedRollout | None:
        """Claim the oldest queued rollout, waiting up to ``timeout`` seconds for one."""
        claimed = self.dequeue_rollouts(1, worker_id=worker_id, timeout=timeout, idempotency_key=idempotency_key)
        return claimed[0] if claimed else None

    @abc.abstractmethod
    def dequeue_rollouts(
        self, limit: int, worker_id: str | None = None, timeout: float = 0.0, *, idempotency_key: str | None = None
    ) -> list[AttemptedRollout]:
        """Claim up to ``limit`` queued rollouts (oldest first); waits up to ``timeout`` for the first.

        With an ``idempotency_key``, a claim is recorded and a repeat returns it (a call that
        claimed nothing is not recorded: its repeat may claim); the key's fingerprint covers
        ``limit`` and ``worker_id``, not ``timeout``."""

    @abc.abstractmethod
    def get_rollout(self, rollout_id: str) -> Rollout:
        """The rollout, or :class:`NotFoundError`."""

    @abc.abstractmethod
    def query_rollouts(self, filter: RolloutFilter | None = None) -> list[Rollout]:
        """Rollouts matching ``filter``, sorted and paged."""

    @abc.abstractmethod
    def count_rollouts(self, filter: RolloutFilter | None = None) -> int:
        """How many rollouts match ``filter`` (ignoring its paging)."""

    @abc.abstractmethod
    def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        """Cancel a rollout that has not finished; its active attempt ends ``failed`` (Cancelled)."""

    @abc.abstractmethod
    def update_rollout_metadata(self, rollout_id: str, metadata: dict[str, Any]) -> Rollout:
        """Merge ``metadata`` into the rollout's metadata (JSON values only)."""

    @abc.abstractmethod
    def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        """Block until every listed rollout is terminal or ``timeout`` passes.

        Returns the rollouts that are terminal at return time, in the order asked. Wakes on
        completion, not on a polling tick, when the completion happens in this process.
        """

    # ---- attempts -------------------------------------------------------------------------
    @abc.abstractmethod
    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        """Every attempt of a rollout, oldest first."""

    def get_latest_attempt(self, rollout_id: str) -> Attempt | None:
        attempts = self.get_attempts(rollout_id)
        return attempts[-1] if attempts else None

    @abc.abstractmethod
    def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus,
        error: AttemptError | None = None,
        *,
        spans: Sequence[Span] = (),
    ) -> Attempt:
        """Move an attempt to ``status`` (and its rollout, if it is the latest attempt).

        ``spans`` of the attempt are stored first, in the same transaction: all or nothing (a
        refused change stores none of them). A runner reports an attempt's success with its
        reward span this way: one write where there were two, on every rollout.
        """

    @abc.abstractmethod
    def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        """Record that the attempt's runner is alive; returns the attempt (check its status)."""

    @abc.abstractmethod
    def check_watchdog(self) -> list[Attempt]:
        """Time out or mark unresponsive the attempts that are overdue; returns those changed."""

    # ---- spans ----------------------------------------------------------------------------
    def add_span(self, span: Span) -> Span:
        return self.add_spans([span])[0]

    @abc.abstractmethod
    def add_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Store spans (idempotently) and return the stored copies with their ``sequence_id``."""

    @abc.abstractmethod
    def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
    ) -> list[Span]:
        """Spans of a rollout ordered by ``sequence_id``; ``attempt_id="latest"`` selects the latest."""

    # ---- resources ------------------------------------------------------------------------
    @abc.abstractmethod
    def add_resources(
        self, items: dict[str, Any], resources_id: str | None = None, *, idempotency_key: str | None = None
    ) -> Resources:
        """Publish a new immutable snapshot; its version is the previous latest + 1."""

    @abc.abstractmethod
    def get_resources(self, resources_id: str) -> Resources:
        """A snapshot by id, or :class:`NotFoundError`."""

    @abc.abstractmethod
    def get_latest_resources(self) -> Resources | None:
        """The snapshot with the highest version, or None when none was published."""

    @abc.abstractmethod
    def query_resources(self) -> list[Resources]:
        """Every snapshot, oldest version first."""

    # ---- workers and metrics ----------------------------------------------------------------
    @abc.abstractmethod
    def update_worker(self, worker: Worker) -> Worker:
        """Insert or replace a worker's record."""

    @abc.abstractmethod
    def query_workers(self) -> list[Worker]:
        """Every worker the store has heard of."""

    @abc.abstractmethod
    def add_metrics(self, records: Sequence[MetricRecord], *, idempotency_key: str | None = None) -> None:
        """Append training metrics (one record per step)."""

    @abc.abstractmethod
    def query_metrics(self, run_id: str | None = None) -> list[MetricRecord]:
        """Metrics in insertion order, optionally of one run."""

    # ---- lifecycle ------------------------------------------------------------------------
    @property
    def shared_url(self) -> str | None:
        """A URL that opens this same store in another process (:func:`open_store`), or None
        for a store private to this process. The Trainer hands it to runner processes; a
        private store is served to them over HTTP instead. Holds no secret (see the token
        of :class:`~agentgrad.store.client.StoreClient`)."""
        return None

    @property
    def in_process(self) -> bool:
        """Whether this store answers in this process, with no network round trip (an SQLite
        file, memory): a runner then makes its short calls on its event loop, where a hand-off to
        a thread and back would cost more than the call. A store behind a network is called from
        threads, so that a slow answer never stalls the loop's other rollouts."""
        return False

    def close(self) -> None:  # noqa: B027 - a no-op default: a backend holding nothing need not override it
        """Release connections and stop background threads."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fill_wrapper(wrapper: type[Store], method_for: Callable[[str], Callable[..., Any]]) -> None:
    """Give ``wrapper`` (a :class:`Store` that wraps another store) every public method of the
    protocol it does not define itself, each made by ``method_for(name)``, and make it concrete.

    Every method, abstract or not: a backend may override the convenience ones (``add_span``) with
    a faster path, which the wrapper must reach. One rule instead of thirty hand-written twins, and
    a method added to the protocol is wrapped without anyone remembering to.
    """
    for name, member in list(vars(Store).items()):
        if callable(member) and not name.startswith("_") and name not in vars(wrapper):
            setattr(wrapper, name, method_for(name))
    abc.update_abstractmethods(wrapper)
