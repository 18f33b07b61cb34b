"""The status machine and store semantics, written once for every local backend.

Backends (memory, SQLite, PostgreSQL) only supply storage primitives inside a transaction — a
:class:`StoreTx`. Everything that decides *what* happens (claims, retries, the watchdog,
heartbeats from spans, idempotent span inserts, resource versions) lives here, so the backends
cannot drift apart and the conformance suite tests one logic through several storages.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

from pydantic import BaseModel

from agentgrad import semconv
from agentgrad.errors import (
    AlreadyExistsError,
    InvalidInputError,
    InvalidTransitionError,
    NotFoundError,
)
from agentgrad.rewards import reward_number
from agentgrad.store import idempotency
from agentgrad.store.idempotency import Replay
from agentgrad.store.jsoncheck import normalize_field, normalize_json, normalize_span, normalized_spans
from agentgrad.store.protocol import RolloutFilter, RolloutRequest, Store
from agentgrad.types import (
    Attempt,
    AttemptedRollout,
    AttemptError,
    AttemptStatus,
    MetricRecord,
    Resources,
    Rollout,
    RolloutStatus,
    Span,
    Worker,
    new_id,
    now,
)

log = logging.getLogger(__name__)

_Model = TypeVar("_Model", bound=BaseModel)
_new_object = object.__new__
# Setters of BaseModel's slots, called directly: cheaper than ``object.__setattr__`` by name.
_set_dict, _set_fields_set, _set_extra, _set_private = (
    BaseModel.__dict__[slot].__set__
    for slot in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")
)


def assembled(model: type[_Model], fields: dict[str, Any], fields_set: set[str]) -> _Model:
    """A ``model`` over ``fields`` without validating them, the way pydantic's own ``__copy__``
    builds one.

    For records the store validated or built itself, and their copies: ``model_copy`` and
    ``model_construct`` do the same several times slower, which shows on every span insert and
    every read of the memory backend. Store records have neither extra fields nor private
    attributes.
    """
    instance = _new_object(model)
    _set_dict(instance, fields)
    _set_fields_set(instance, fields_set)
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


def trusted(model: type[_Model], **fields: Any) -> _Model:
    """A ``model`` the store built itself from checked values, without validating them again.

    ``fields`` must name every field, in declaration order (as validation would fill them).
    """
    assert tuple(fields) == _field_names(model), f"{model.__name__}: name every field, in order"
    return assembled(model, fields, set(fields))


@functools.cache
def _field_names(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(model.model_fields)


def to_json(record: BaseModel) -> bytes:
    """``record.model_dump_json()`` as UTF-8, calling the serializer directly: pydantic's wrapper
    spends a third of the call forwarding its keyword arguments."""
    return record.__pydantic_serializer__.to_json(record)


def from_json(model: type[_Model], text: str | bytes) -> _Model:
    """``model.model_validate_json(text)`` without the wrapper, which costs as much as the
    validation of a small record."""
    return model.__pydantic_validator__.validate_json(text)


def from_json_many(model: type[_Model], texts: Iterable[str | bytes]) -> list[_Model]:
    """:func:`from_json` over many texts (the reads that return lists: spans above all)."""
    validate = model.__pydantic_validator__.validate_json
    return [validate(text) for text in texts]


def evolved(model: _Model, **changes: Any) -> _Model:
    """A shallow copy of ``model`` with ``changes`` (trusted values), as ``model_copy(update=…)``
    makes it, at a fraction of the cost."""
    return assembled(type(model), {**model.__dict__, **changes}, model.__pydantic_fields_set__ | changes.keys())


class AttemptClock(NamedTuple):
    """What the watchdog needs to know of one active attempt: its times and its rollout's limits.

    Backends read these few numbers without building whole records, so a sweep over thousands
    of healthy attempts stays cheap (it runs every half second, inside a write transaction).
    """

    rollout_id: str
    attempt_id: str
    start_time: float
    last_heartbeat_time: float | None
    timeout_seconds: float | None
    unresponsive_seconds: float | None


class StoreTx(Protocol):
    """Storage primitives a backend offers inside one transaction.

    Objects passed in and returned are owned by the caller: backends must not keep references
    to them (memory copies, SQL serializes). The ``peek_*`` reads are the one exception, for
    the hottest paths: they may return the backend's own record, which the core must neither
    change nor hand out. A copy of a view made with :func:`evolved` shares the view's nested
    values; it may be handed out once saved, since saving replaces the record the view was.
    """

    def get_rollout(self, rollout_id: str) -> Rollout | None: ...
    def peek_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout as a read-only view: the core must neither change it nor hand it out."""
        ...

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None: ...
    def save_rollout(self, rollout: Rollout, *, private: bool = False) -> None:
        """Replace the stored rollout. ``private``: the core made this record for the store alone
        and nobody else will ever hold it, so a backend that keeps objects may keep it as it is
        (no copy); it may share nested values with the view it was made from."""
        ...

    def push_queue(self, rollout_ids: Sequence[str]) -> None: ...
    def has_queued(self) -> bool:
        """Whether any rollout is queued (a read: it takes nothing off the queue)."""
        ...

    def pop_queue(self, limit: int) -> list[str]: ...
    def remove_from_queue(self, rollout_id: str) -> None: ...
    def query_rollouts(self, filter: RolloutFilter) -> list[Rollout]: ...
    def count_rollouts(self, filter: RolloutFilter) -> int: ...

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None: ...
    def peek_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        """The attempt as a read-only view, like :meth:`peek_rollout`."""
        ...

    def get_attempts(self, rollout_id: str) -> list[Attempt]: ...
    def insert_attempt(self, attempt: Attempt) -> None: ...
    def save_attempt(self, attempt: Attempt, *, private: bool = False) -> None:
        """Replace the stored attempt; ``private`` as for :meth:`save_rollout`."""
        ...

    def attempt_clocks(self) -> list[AttemptClock]:
        """One clock per attempt in ``preparing`` or ``running`` (those of rollouts that set no
        time limit may be left out: they can never be overdue)."""
        ...

    def insert_spans(self, rollout_id: str, spans: Sequence[Span]) -> list[tuple[Span, bool]]:
        """Insert spans of one rollout; returns (stored copy, newly inserted) per span.

        New spans get the next ``sequence_id`` values of the rollout's own counter (kept by the
        backend, never derived from clocks); repeats return the first stored copy.
        """
        ...

    def query_spans(
        self, rollout_id: str, attempt_id: str | None, name: str | None, after_sequence_id: int, limit: int | None
    ) -> list[Span]: ...

    def get_resources(self, resources_id: str) -> Resources | None: ...
    def latest_resources(self) -> Resources | None: ...
    def insert_resources(self, resources: Resources) -> None: ...
    def all_resources(self) -> list[Resources]: ...

    def save_worker(self, worker: Worker) -> None: ...
    def all_workers(self) -> list[Worker]: ...
    def insert_metrics(self, records: Sequence[MetricRecord]) -> None: ...
    def query_metrics(self, run_id: str | None) -> list[MetricRecord]: ...

    def find_replay(self, scope: str, key: str) -> tuple[str, str] | None:
        """The (fingerprint, answer JSON) recorded for an idempotency key, or None."""
        ...

    def save_replay(self, scope: str, key: str, fingerprint: str, answer: str, stamp: float) -> None:
        """Record an idempotency key's answer (the key is not recorded yet: the core looked)."""
        ...

    def prune_replays(self, expired_before: float, keep: int) -> None:
        """Drop the records written before ``expired_before`` and all but the ``keep`` newest."""
        ...


#: A burst of spans refreshes the attempt's heartbeat at most this often (one write, not one
#: per span); far below any sensible ``unresponsive_seconds``.
HEARTBEAT_RESOLUTION_SECONDS = 0.01

_RETRY_REASON = {
    AttemptStatus.FAILED: "failed",
    AttemptStatus.TIMEOUT: "timeout",
    AttemptStatus.UNRESPONSIVE: "unresponsive",
}


def _checked_metadata(metadata: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``group_id`` is what GRPO groups by and what queries filter on: it must be a string."""
    group_id = metadata.get("group_id")
    if group_id is not None and not isinstance(group_id, str):
        raise InvalidInputError(f"{where}field 'metadata.group_id' must be a string, got {type(group_id).__name__}")
    if group_id is not None and "\x00" in group_id:  # a column of its own: as for every stored name
        raise InvalidInputError(f"{where}field 'metadata.group_id' must not contain a NUL character")
    return metadata


_RUNNING, _PREPARING = AttemptStatus.RUNNING, AttemptStatus.PREPARING
#: Statuses by value; members of a ``str`` enum hash and compare as their values, so this finds
#: both (an enum lookup by value is slow Python code, paid on every status update).
_ATTEMPT_STATUS = {status.value: status for status in AttemptStatus}
_LLM_CALL, _REWARD = semconv.SPAN_LLM_CALL, semconv.SPAN_REWARD


#: What :meth:`TransactionalStore._replayed` returns for a key with no record (None is an answer).
_FRESH: Any = object()


def _refuse_transition(attempt: Attempt, status: AttemptStatus) -> None:
    """Raise :class:`InvalidTransitionError` for a change the state machine forbids (an ended
    attempt, or back to ``preparing``); staying in the same status is no change."""
    if attempt.status != status and (attempt.status.is_terminal or status == AttemptStatus.PREPARING):
        raise InvalidTransitionError("attempt", attempt.attempt_id, attempt.status.value, status.value)


def _heard_from(attempt_id: str, attempts: dict[str, Attempt], spans: list[Span]) -> bool:
    """Whether one of ``spans`` (all of them of the named ``attempts``) is of ``attempt_id``."""
    return len(attempts) == 1 or any(span.attempt_id == attempt_id for span in spans)


class TransactionalStore(Store):
    """Store semantics over a backend's transactional primitives.

    Args:
        watchdog_interval: seconds between background watchdog sweeps; None disables the thread
            (callers then run :meth:`check_watchdog` themselves, as tests do).
        external_poll_interval: for backends that other processes write to (SQLite files,
            PostgreSQL), how often waiters re-check for changes made elsewhere. Changes made in
            this process always wake waiters at once.
        clock: the wall clock (seconds since the epoch) the store reads for every time it records
            or judges: enqueue/start/end stamps, heartbeats, and the watchdog's timeout and
            silence checks. Tests inject a manual one to move time without sleeping. Blocking
            waits (``dequeue_rollouts(timeout=)``, ``wait_for_rollouts``) and the interval
            between background sweeps stay on real time: they pace threads, not records.
    """

    def __init__(
        self,
        *,
        watchdog_interval: float | None = 0.5,
        external_poll_interval: float | None = None,
        clock: Callable[[], float] = now,
    ) -> None:
        self._clock = clock
        # The watchdog counts an attempt's silence from this moment at the earliest: while the
        # store was closed (a restart of the store service) no runner could have reached it.
        self._opened_at = clock()
        self._changed = threading.Condition()
        self._change_count = 0
        self._waiting = 0  # callers inside _wait_until
        self._watcher: int | None = None  # the waiter that looks for outside changes (_wait_for_change)
        self._outside_seen: object | None = None  # the last outside version the waiters were woken for
        self._external_poll = external_poll_interval
        self._closed = threading.Event()
        self._watchdog_thread: threading.Thread | None = None
        if watchdog_interval:
            self._watchdog_thread = threading.Thread(
                target=self._watchdog_loop, args=(watchdog_interval,), name="agentgrad-watchdog", daemon=True
            )
            self._watchdog_thread.start()

    # ---- backend hooks ----------------------------------------------------------------------
    @abc.abstractmethod
    def _transaction(self) -> contextlib.AbstractContextManager[StoreTx]:
        """A transaction: every primitive inside commits together or not at all."""

    def _close_backend(self) -> None:
        """Release the backend's connections."""

    def _outside_version(self) -> object | None:
        """A value that moves at least whenever a change to the store has been committed from
        outside this store object (another process) since it was last read — or None when the
        backend cannot tell, and waiters look again every ``external_poll_interval`` whatever
        happened."""
        return None

    # ---- change notification -------------------------------------------------------------------
    def _notify(self) -> None:
        """Wake the waiters after a change has been committed.

        With nobody waiting (the usual case on the write paths) this costs one attribute read:
        a waiter registers before it first looks at the store, so a change committed before it
        registered is one its own look will see.
        """
        if self._waiting:
            with self._changed:
                self._change_count += 1
                self._changed.notify_all()

    def _wait_until(self, check: Any, timeout: float | None) -> Any:
        """Re-run ``check`` after every change until it returns a truthy value or time runs out."""
        if timeout is not None and timeout <= 0:
            return check()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            self._waiting += 1
        try:
            while True:
                # The outside version is read before the look (and announced if it moved, for the
                # other waiters): a change committed after it moves it again, and wakes this one.
                outside = self._look_outside() if self._external_poll is not None else None
                with self._changed:
                    seen = self._change_count
                result = check()
                if result:
                    return result
                if deadline is not None and deadline - time.monotonic() <= 0:
                    return result
                self._wait_for_change(seen, outside is not None, deadline)
                if self._closed.is_set():
                    return check()
                if outside is not None and deadline is not None and deadline - time.monotonic() <= 0:
                    # At the deadline a backend that can tell says whether anything was committed
                    # since the look: if not, a last look would find nothing again (an idle long
                    # poll's second read, every poll).
                    self._look_outside()
                    with self._changed:
                        if self._change_count == seen:
                            return result
        finally:
            with self._changed:
                self._waiting -= 1
                if self._watcher == threading.get_ident():
                    self._watcher = None
                if self._watcher is None and self._waiting and self._outside_seen is not None:
                    self._changed.notify()  # one waiter wakes to take the watch (or hands it on as it leaves)

    def _wait_for_change(self, seen: int, can_tell: bool, deadline: float | None) -> None:
        """Sleep until a change this process made (a notify), one made from outside, the store's
        close or ``deadline``.

        Changes made from outside are looked for every ``external_poll_interval``. When the
        backend can tell them (:meth:`_outside_version`: SQLite, PostgreSQL, Redis), one waiter at
        a time watches — reads the version each interval and wakes the others when it moved — and
        the others sleep until woken: the idle slots of a runner, or the long polls a store
        service holds for many runners, then cost one wake-up and one read of a number per
        interval between them, instead of a look at the queue each (an idle runner with eight
        slots made 190 a second). A backend that cannot tell has every waiter look again each
        interval."""
        me = threading.get_ident()
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            with self._changed:
                if self._change_count != seen or self._closed.is_set():
                    return
                poll = self._external_poll
                if poll is not None and can_tell:
                    if self._watcher not in (None, me):
                        poll = None  # another waiter watches: sleep until woken
                    else:
                        self._watcher = me
                if poll is not None:
                    remaining = poll if remaining is None else min(remaining, poll)
                self._changed.wait(remaining)
                if self._change_count != seen or self._closed.is_set():
                    return
            if poll is None:
                continue  # the deadline, or a hand-over of the watch (see _wait_until)
            if not can_tell:
                return  # look again
            self._look_outside()  # wakes everyone, this waiter too, if the store changed

    def _look_outside(self) -> object | None:
        """:meth:`_outside_version`, and a wake-up for every waiter the first time it has moved."""
        version = self._outside_version()
        if version is not None and version != self._outside_seen:
            with self._changed:
                if version != self._outside_seen:
                    self._outside_seen = version
                    self._change_count += 1
                    self._changed.notify_all()
        return version

    # ---- rollouts -------------------------------------------------------------------------------
    def enqueue_rollouts(
        self, requests: Sequence[RolloutRequest | dict[str, Any]], *, idempotency_key: str | None = None
    ) -> list[Rollout]:
        parsed = [r if isinstance(r, RolloutRequest) else RolloutRequest.model_validate(r) for r in requests]
        for index, request in enumerate(parsed):
            where = f"rollout {index}: " if len(parsed) > 1 else ""
            normalize_field(request, "input", "input", where)
            _checked_metadata(normalize_field(request, "metadata", "metadata", where), where)
        replay = idempotency.replay("enqueue_rollouts", idempotency_key, parsed)
        stamp = self._clock()
        rollouts = [
            trusted(
                Rollout,
                rollout_id=request.rollout_id or new_id("ro"),
                input=request.input,
                mode=request.mode,
                resources_id=request.resources_id,
                status=RolloutStatus.QUEUING,
                config=request.config,
                metadata=request.metadata,
                enqueue_time=stamp,
                start_time=None,
                end_time=None,
                num_attempts=0,
                reward=None,
                llm_calls=0,
                agent_names=[],
            )
            for request in parsed
        ]
        ids = [r.rollout_id for r in rollouts]
        if len(set(ids)) != len(ids):
            raise AlreadyExistsError("a batch names the same rollout_id twice")
        with self._transaction() as tx:
            if replay is not None and (first := self._replayed(tx, replay)) is not _FRESH:
                return first
            for rollout_id in ids:
                if tx.peek_rollout(rollout_id) is not None:
                    raise AlreadyExistsError(f"rollout {rollout_id!r} already exists")
            tx.insert_rollouts(rollouts)
            tx.push_queue(ids)
            if replay is not None:
                self._record(tx, replay, rollouts)
        self._notify()
        return rollouts

    def dequeue_rollouts(
        self, limit: int, worker_id: str | None = None, timeout: float = 0.0, *, idempotency_key: str | None = None
    ) -> list[AttemptedRollout]:
        if limit < 1:
            raise InvalidInputError(f"limit must be ≥ 1, got {limit}")
        replay = idempotency.replay("dequeue_rollouts", idempotency_key, limit, worker_id)
        claimed = self._wait_until(lambda: self._claim(limit, worker_id, replay), timeout)
        return claimed or []

    def _claimable(self, replay: Replay | None) -> bool:
        """Whether a claim can find anything: a rollout queued, or an answer recorded for its key.

        A read, which a backend makes apart from its writes, without the write lock
        (:func:`~agentgrad.store.sql.reads_apart`): every idle slot of every runner looks when its
        long poll starts and whenever the store may have changed (each ``external_poll_interval``
        where the backend cannot tell, :meth:`_wait_for_change`), and each look was a write
        transaction that took the lock to find the queue empty — an idle runner with eight slots
        spent 5 % of a core on it, and held up the capture proxy's and the other runners' writes
        meanwhile."""
        with self._transaction() as tx:
            return tx.has_queued() or (replay is not None and tx.find_replay(replay.scope, replay.key) is not None)

    def _claim(self, limit: int, worker_id: str | None, replay: Replay | None = None) -> list[AttemptedRollout]:
        """One claim transaction; with ``replay``, a claim already recorded for its key is
        answered instead (each look of a long poll checks: a same-key call may have claimed)."""
        if not self._claimable(replay):
            return []
        claimed: list[AttemptedRollout] = []
        with self._transaction() as tx:
            if replay is not None and (first := self._replayed(tx, replay)) is not _FRESH:
                return first
            for rollout_id in tx.pop_queue(limit):
                view = tx.peek_rollout(rollout_id)
                if view is None or not view.status.is_queued:
                    continue
                stamp = self._clock()
                attempt = trusted(
                    Attempt,
                    rollout_id=rollout_id,
                    attempt_id=new_id("at"),
                    sequence_id=view.num_attempts + 1,
                    worker_id=worker_id,
                    status=AttemptStatus.PREPARING,
                    start_time=stamp,
                    end_time=None,
                    last_heartbeat_time=stamp,
                    error=None,
                )
                rollout = evolved(
                    view,
                    status=RolloutStatus.PREPARING,
                    num_attempts=attempt.sequence_id,
                    start_time=view.start_time or stamp,
                    reward=None,
                    llm_calls=0,
                    agent_names=[],
                )
                tx.insert_attempt(attempt)
                tx.save_rollout(rollout)
                claimed.append(trusted(AttemptedRollout, rollout=rollout, attempt=attempt))
            if replay is not None and claimed:
                self._record(tx, replay, claimed)
        if replay is not None and claimed:
            self._notify()  # a same-key call long-polling beside this one answers with this claim
        return claimed

    def get_rollout(self, rollout_id: str) -> Rollout:
        with self._transaction() as tx:
            return self._require_rollout(tx, rollout_id)

    def query_rollouts(self, filter: RolloutFilter | None = None) -> list[Rollout]:
        with self._transaction() as tx:
            return tx.query_rollouts(filter or RolloutFilter())

    def count_rollouts(self, filter: RolloutFilter | None = None) -> int:
        with self._transaction() as tx:
            return tx.count_rollouts(filter or RolloutFilter())

    def cancel_rollout(self, rollout_id: str, *, idempotency_key: str | None = None) -> Rollout:
        replay = idempotency.replay("cancel_rollout", idempotency_key, rollout_id)
        with self._transaction() as tx:
            if replay is not None and (first := self._replayed(tx, replay)) is not _FRESH:
                return first
            rollout = self._require_rollout(tx, rollout_id)
            if rollout.status.is_terminal:
                raise InvalidTransitionError("rollout", rollout_id, rollout.status.value, "cancelled")
            stamp = self._clock()
            if rollout.status.is_queued:
                tx.remove_from_queue(rollout_id)
            attempts = tx.get_attempts(rollout_id)
            if attempts and not attempts[-1].status.is_terminal:
                latest = attempts[-1]
                latest.status = AttemptStatus.FAILED
                latest.end_time = stamp
                latest.error = AttemptError(type="Cancelled", message=f"rollout {rollout_id!r} was cancelled")
                tx.save_attempt(latest)
            rollout.status = RolloutStatus.CANCELLED
            rollout.end_time = stamp
            tx.save_rollout(rollout)
            if replay is not None:
                self._record(tx, replay, rollout)
        self._notify()
        return rollout

    def update_rollout_metadata(self, rollout_id: str, metadata: dict[str, Any]) -> Rollout:
        metadata = _checked_metadata(normalize_json(metadata, "metadata"))
        with self._transaction() as tx:
            rollout = self._require_rollout(tx, rollout_id)
            rollout.metadata = {**rollout.metadata, **metadata}
            tx.save_rollout(rollout)
        return rollout

    def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        ids = list(rollout_ids)
        with self._transaction() as tx:
            for rollout_id in ids:
                self._require_rollout(tx, rollout_id, view=True)
        pending = dict.fromkeys(ids)  # in order; a rollout that ended stays ended: looked at no more

        def all_done() -> bool:
            # This runs after every change while anyone waits (each span the capture proxy
            # writes), so it reads as little as it can: read-only views, no copies (copying every
            # rollout of a batch made a 200-rollout wait cost as much CPU as the rollouts
            # themselves), and it stops at the first rollout still going — rollouts end about in
            # the order they were queued, and reading every pending one after every change took
            # a trainer process's whole core while 2,000 were queued (issue 24).
            with self._transaction() as tx:
                for rollout_id in list(pending):
                    view = tx.peek_rollout(rollout_id)
                    if view is None or not view.status.is_terminal:
                        return False
                    del pending[rollout_id]
            return True

        self._wait_until(all_done, timeout)
        with self._transaction() as tx:  # copies, as they are now (a late reward span may have come)
            current = [tx.get_rollout(rollout_id) for rollout_id in ids]
        return [r for r in current if r is not None and r.status.is_terminal]

    # ---- attempts -------------------------------------------------------------------------------
    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        with self._transaction() as tx:
            self._require_rollout(tx, rollout_id, view=True)
            return tx.get_attempts(rollout_id)

    def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | str,
        error: AttemptError | None = None,
        *,
        spans: Sequence[Span | dict[str, Any]] = (),
    ) -> Attempt:
        known = _ATTEMPT_STATUS.get(status) if isinstance(status, str) else None
        if known is None:
            allowed = ", ".join(_ATTEMPT_STATUS)
            raise InvalidInputError(f"unknown attempt status {status!r} (allowed: {allowed})")
        status = known
        parsed = normalized_spans(spans)
        for span in parsed:
            if (span.rollout_id, span.attempt_id) != (rollout_id, attempt_id):
                raise InvalidInputError(
                    f"span {span.span_id!r} belongs to rollout {span.rollout_id!r} attempt {span.attempt_id!r}, "
                    f"not to the attempt being updated ({rollout_id!r}, {attempt_id!r})"
                )
        with self._transaction() as tx:
            rollout = self._require_rollout(tx, rollout_id, view=True)
            attempt = self._require_attempt(tx, rollout_id, attempt_id, view=True)
            absorbed = False
            if parsed:
                _refuse_transition(attempt, status)  # before writing: the memory store has no rollback
                results = tx.insert_spans(rollout_id, parsed)
                absorbed = self._absorb_spans(tx, rollout, {attempt_id: attempt}, [s for s, new in results if new])
                rollout = self._require_rollout(tx, rollout_id, view=True)  # as the spans left them
                attempt = self._require_attempt(tx, rollout_id, attempt_id, view=True)
            saved, wake = self._transition(tx, rollout, attempt, status, error)
            wake |= absorbed
            if saved is None:  # already in that status: hand out a copy, not the view
                saved = self._require_attempt(tx, rollout_id, attempt_id)
        if wake or status.is_terminal:
            self._notify()
        return saved

    def _transition(
        self, tx: StoreTx, rollout: Rollout, attempt: Attempt, status: AttemptStatus, error: AttemptError | None
    ) -> tuple[Attempt | None, bool]:
        """Apply one attempt status change and its effect on the rollout.

        ``rollout`` and ``attempt`` may be read-only views: changes are saved from copies.
        Returns the saved attempt (None when it already had ``status``) and whether the queue
        or a rollout's terminal state changed (waiters must wake).
        """
        if attempt.status == status:
            return None, False
        _refuse_transition(attempt, status)
        stamp = self._clock()
        if status.is_terminal:
            attempt = evolved(attempt, status=status, end_time=stamp, error=error or attempt.error)
        else:
            attempt = evolved(attempt, status=status, last_heartbeat_time=stamp)
        tx.save_attempt(attempt)

        is_latest = attempt.sequence_id == rollout.num_attempts
        if not is_latest or rollout.status.is_terminal or rollout.status.is_queued:
            return attempt, False
        if status == AttemptStatus.RUNNING:
            tx.save_rollout(evolved(rollout, status=RolloutStatus.RUNNING), private=True)
            return attempt, False
        if status == AttemptStatus.SUCCEEDED:
            changes: dict[str, Any] = {"status": RolloutStatus.SUCCEEDED, "end_time": stamp}
        elif _RETRY_REASON[status] in rollout.config.retry_on and rollout.num_attempts < rollout.config.max_attempts:
            # Results of the failed attempt don't carry over.
            changes = {"status": RolloutStatus.REQUEUING, "reward": None, "llm_calls": 0, "agent_names": []}
            tx.push_queue([rollout.rollout_id])
        else:
            changes = {"status": RolloutStatus.FAILED, "end_time": stamp}
        tx.save_rollout(evolved(rollout, **changes), private=True)
        return attempt, True

    def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        with self._transaction() as tx:
            self._require_rollout(tx, rollout_id, view=True)
            attempt = self._require_attempt(tx, rollout_id, attempt_id, view=True)
            if attempt.status.is_terminal:
                return self._require_attempt(tx, rollout_id, attempt_id)  # a copy, not the view
            attempt = evolved(attempt, last_heartbeat_time=self._clock())
            tx.save_attempt(attempt)
            return attempt

    def check_watchdog(self) -> list[Attempt]:
        changed: list[Attempt] = []
        with self._transaction() as tx:
            stamp = self._clock()
            for clock in tx.attempt_clocks():
                last_sign = max(clock.last_heartbeat_time or clock.start_time, self._opened_at)
                if clock.timeout_seconds is not None and stamp - clock.start_time > clock.timeout_seconds:
                    verdict, why = AttemptStatus.TIMEOUT, f"no result within {clock.timeout_seconds} s"
                elif clock.unresponsive_seconds is not None and stamp - last_sign > clock.unresponsive_seconds:
                    verdict, why = AttemptStatus.UNRESPONSIVE, f"no heartbeat for {clock.unresponsive_seconds} s"
                else:
                    continue
                rollout = tx.peek_rollout(clock.rollout_id)
                attempt = tx.peek_attempt(clock.rollout_id, clock.attempt_id)
                if rollout is None or attempt is None:
                    continue
                error = AttemptError(type=verdict.value.capitalize(), message=f"watchdog: {why}")
                saved, _ = self._transition(tx, rollout, attempt, verdict, error)
                if saved is not None:
                    changed.append(saved)
        if changed:
            log.info("watchdog ended %d attempt(s)", len(changed))
            self._notify()
        return changed

    def _watchdog_loop(self, interval: float) -> None:
        while not self._closed.wait(interval):
            try:
                self.check_watchdog()
            except Exception:  # the watchdog must outlive transient backend errors
                log.exception("watchdog sweep failed")

    # ---- spans ----------------------------------------------------------------------------------
    def add_span(self, span: Span | dict[str, Any]) -> Span:
        """One span, the way emitters and runners send them: the batch path's work without its
        grouping, which costs a fifth of a single in-memory insert."""
        span = span if isinstance(span, Span) else Span.model_validate(span)
        normalize_span(span, None)
        rollout_id, attempt_id = span.rollout_id, span.attempt_id
        with self._transaction() as tx:
            rollout = self._require_rollout(tx, rollout_id, view=True)
            attempt = self._require_attempt(tx, rollout_id, attempt_id, view=True)
            ((stored, is_new),) = tx.insert_spans(rollout_id, (span,))
            wake = is_new and self._absorb_spans(tx, rollout, {attempt_id: attempt}, [stored])
        if wake:
            self._notify()
        return stored

    def add_spans(self, spans: Sequence[Span | dict[str, Any]]) -> list[Span]:
        parsed = normalized_spans(spans)
        positions: dict[str, list[int]] = {}  # rollout_id → indexes into parsed
        for index, span in enumerate(parsed):
            positions.setdefault(span.rollout_id, []).append(index)
        stored = list(parsed)  # each replaced by its stored copy below
        wake = False
        with self._transaction() as tx:
            # Resolve every id before writing anything: a refused batch stores nothing.
            targets = []
            for rollout_id, indexes in positions.items():
                rollout = self._require_rollout(tx, rollout_id, view=True)
                attempts: dict[str, Attempt] = {}
                for index in indexes:
                    attempt_id = parsed[index].attempt_id
                    if attempt_id not in attempts:
                        attempts[attempt_id] = self._require_attempt(tx, rollout_id, attempt_id, view=True)
                targets.append((rollout, attempts, indexes))
            for rollout, attempts, indexes in targets:
                results = tx.insert_spans(rollout.rollout_id, [parsed[i] for i in indexes])
                for index, (span, _) in zip(indexes, results, strict=True):
                    stored[index] = span
                wake |= self._absorb_spans(tx, rollout, attempts, [span for span, is_new in results if is_new])
        if wake:
            self._notify()
        return stored

    def _absorb_spans(self, tx: StoreTx, rollout: Rollout, attempts: dict[str, Attempt], spans: list[Span]) -> bool:
        """New spans are heartbeats; reward and LLM-call spans of the latest attempt update the
        rollout. (Runs on every span insert: status checks compare identities with constants.)

        ``rollout`` and ``attempts`` are read-only views (of every attempt the batch named):
        changes are saved from copies. Returns True if waiters must wake.
        """
        if not spans:
            return False
        wake = False
        stamp = self._clock()
        latest = None
        for attempt_id, attempt in attempts.items():
            if attempt.sequence_id == rollout.num_attempts:
                latest = attempt_id
            status = attempt.status
            if status is _RUNNING:
                if stamp - (attempt.last_heartbeat_time or 0.0) >= HEARTBEAT_RESOLUTION_SECONDS and _heard_from(
                    attempt_id, attempts, spans
                ):
                    tx.save_attempt(evolved(attempt, last_heartbeat_time=stamp), private=True)
            elif status is _PREPARING and _heard_from(attempt_id, attempts, spans):
                wake |= self._transition(tx, rollout, attempt, _RUNNING, None)[1]
                rollout = self._require_rollout(tx, rollout.rollout_id, view=True)  # as _transition saved it
        reward, llm_calls, agent_names = rollout.reward, rollout.llm_calls, rollout.agent_names
        for span in spans:
            if span.attempt_id == latest:
                name = span.name
                if name == _LLM_CALL:
                    llm_calls += 1
                    agent = span.attributes.get(semconv.AGENT_NAME)
                    if isinstance(agent, str) and agent not in agent_names:
                        agent_names = [*agent_names, agent]  # a copy: ``rollout`` is a read-only view
                elif name == _REWARD:
                    # A span that is not a reward number leaves the reward as it was (the
                    # store reads spans written by anyone; it does not refuse them for this).
                    value = reward_number(span.attributes.get(semconv.REWARD_VALUE))
                    if value is not None:
                        reward = value
        if llm_calls != rollout.llm_calls or reward != rollout.reward:
            changes = {"reward": reward, "llm_calls": llm_calls, "agent_names": agent_names}
            tx.save_rollout(evolved(rollout, **changes), private=True)
        return wake

    def query_spans(
        self,
        rollout_id: str,
        attempt_id: str | Literal["latest"] | None = None,
        name: str | None = None,
        after_sequence_id: int = 0,
        limit: int | None = None,
    ) -> list[Span]:
        with self._transaction() as tx:
            self._require_rollout(tx, rollout_id, view=True)
            if attempt_id == "latest":
                attempts = tx.get_attempts(rollout_id)
                if not attempts:
                    return []
                attempt_id = attempts[-1].attempt_id
            elif attempt_id is not None:
                self._require_attempt(tx, rollout_id, attempt_id, view=True)
            return tx.query_spans(rollout_id, attempt_id, name, after_sequence_id, limit)

    # ---- resources ------------------------------------------------------------------------------
    def add_resources(
        self, items: dict[str, Any], resources_id: str | None = None, *, idempotency_key: str | None = None
    ) -> Resources:
        for name, item in items.items():
            normalize_json(item.model_dump() if isinstance(item, BaseModel) else item, f"items.{name}")
        snapshot = Resources(resources_id=resources_id or new_id("res"), version=0, items=items)
        replay = idempotency.replay("add_resources", idempotency_key, resources_id, snapshot.items)
        with self._transaction() as tx:
            if replay is not None and (first := self._replayed(tx, replay)) is not _FRESH:
                return first
            if tx.get_resources(snapshot.resources_id) is not None:
                raise AlreadyExistsError(
                    f"resources {snapshot.resources_id!r} already exist; snapshots are immutable, "
                    "publish a new one instead"
                )
            latest = tx.latest_resources()
            snapshot.version = (latest.version if latest else 0) + 1
            snapshot.create_time = self._clock()
            tx.insert_resources(snapshot)
            if replay is not None:
                self._record(tx, replay, snapshot)
        return snapshot

    def get_resources(self, resources_id: str) -> Resources:
        with self._transaction() as tx:
            found = tx.get_resources(resources_id)
        if found is None:
            raise NotFoundError("resources", resources_id)
        return found

    def get_latest_resources(self) -> Resources | None:
        with self._transaction() as tx:
            return tx.latest_resources()

    def query_resources(self) -> list[Resources]:
        with self._transaction() as tx:
            return tx.all_resources()

    # ---- workers and metrics --------------------------------------------------------------------
    def update_worker(self, worker: Worker | dict[str, Any]) -> Worker:
        worker = worker if isinstance(worker, Worker) else Worker.model_validate(worker)
        normalize_field(worker, "metadata", "metadata")
        with self._transaction() as tx:
            tx.save_worker(worker)
        return worker

    def query_workers(self) -> list[Worker]:
        with self._transaction() as tx:
            return tx.all_workers()

    def add_metrics(
        self, records: Sequence[MetricRecord | dict[str, Any]], *, idempotency_key: str | None = None
    ) -> None:
        parsed = [r if isinstance(r, MetricRecord) else MetricRecord.model_validate(r) for r in records]
        for record in parsed:
            normalize_json(record.values, f"values of step {record.step}")
        replay = idempotency.replay("add_metrics", idempotency_key, parsed)
        with self._transaction() as tx:
            if replay is not None and self._replayed(tx, replay) is not _FRESH:
                return
            tx.insert_metrics(parsed)
            if replay is not None:
                self._record(tx, replay, None)

    def query_metrics(self, run_id: str | None = None) -> list[MetricRecord]:
        with self._transaction() as tx:
            return tx.query_metrics(run_id)

    # ---- idempotency keys (the rules: agentgrad.store.idempotency) ------------------------------
    #: Seconds a key's record is kept, the most records kept, and how many recorded writes of
    #: this object pass between two prunes (settable per store object, as tests do).
    replay_ttl_seconds: float = idempotency.TTL_SECONDS
    max_replays: int = idempotency.MAX_RECORDS
    replay_prune_interval: int = idempotency.PRUNE_EVERY
    _replays_recorded = 0

    def _replayed(self, tx: StoreTx, replay: Replay) -> Any:
        """The first answer recorded for ``replay``'s key, or ``_FRESH`` when there is none;
        IdempotencyKeyReusedError when the key was recorded for another request."""
        found = tx.find_replay(replay.scope, replay.key)
        if found is None:
            return _FRESH
        fingerprint, answer = found
        if fingerprint != replay.fingerprint:
            raise idempotency.refused(replay)
        return idempotency.load_answer(replay.scope, answer)

    def _record(self, tx: StoreTx, replay: Replay, answer: Any) -> None:
        """Record ``answer`` for ``replay``'s key inside the write's transaction, pruning now and
        then (see :mod:`agentgrad.store.idempotency`)."""
        stamp = self._clock()
        tx.save_replay(
            replay.scope, replay.key, replay.fingerprint, idempotency.dump_answer(replay.scope, answer), stamp
        )
        if self._replays_recorded % max(1, self.replay_prune_interval) == 0:
            tx.prune_replays(stamp - self.replay_ttl_seconds, self.max_replays)
        self._replays_recorded += 1

    # ---- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _require_rollout(tx: StoreTx, rollout_id: str, *, view: bool = False) -> Rollout:
        """The rollout, or NotFoundError; ``view``: a read-only view (see ``StoreTx.peek_rollout``)."""
        rollout = tx.peek_rollout(rollout_id) if view else tx.get_rollout(rollout_id)
        if rollout is None:
            raise NotFoundError("rollout", rollout_id)
        return rollout

    @staticmethod
    def _require_attempt(tx: StoreTx, rollout_id: str, attempt_id: str, *, view: bool = False) -> Attempt:
        attempt = tx.peek_attempt(rollout_id, attempt_id) if view else tx.get_attempt(rollout_id, attempt_id)
        if attempt is None:
            raise NotFoundError("attempt", attempt_id, f" of rollout {rollout_id!r}")
        return attempt

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._notify()
        if self._watchdog_thread is not None:
            self._watchdog_thread.join(timeout=5)
        self._close_backend()
