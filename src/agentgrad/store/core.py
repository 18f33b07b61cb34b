"""The status machine and store semantics, written once for every local backend.

Backends (memory, SQLite, PostgreSQL) only supply storage primitives inside a transaction — a
:class:`StoreTx`. Everything that decides *what* happens (claims, retries, the watchdog,
heartbeats from spans, idempotent span inserts, resource versions) lives here, so the backends
cannot drift apart and the conformance suite tests one logic through several storages.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from agentgrad import semconv
from agentgrad.errors import (
    AlreadyExistsError,
    InvalidInputError,
    InvalidTransitionError,
    NotFoundError,
)
from agentgrad.store.jsoncheck import normalize_json
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


class StoreTx(Protocol):
    """Storage primitives a backend offers inside one transaction.

    Objects passed in and returned are owned by the caller: backends must not keep references
    to them (memory copies, SQL serializes).
    """

    def get_rollout(self, rollout_id: str) -> Rollout | None: ...
    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None: ...
    def save_rollout(self, rollout: Rollout) -> None: ...
    def push_queue(self, rollout_ids: Sequence[str]) -> None: ...
    def pop_queue(self, limit: int) -> list[str]: ...
    def remove_from_queue(self, rollout_id: str) -> None: ...
    def query_rollouts(self, filter: RolloutFilter) -> list[Rollout]: ...
    def count_rollouts(self, filter: RolloutFilter) -> int: ...

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None: ...
    def get_attempts(self, rollout_id: str) -> list[Attempt]: ...
    def insert_attempt(self, attempt: Attempt) -> None: ...
    def save_attempt(self, attempt: Attempt) -> None: ...
    def active_attempts(self) -> list[Attempt]: ...

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
    return metadata


def _number(value: Any) -> float | None:
    """A finite float from a reward attribute, or None (rewards must be numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class TransactionalStore(Store):
    """Store semantics over a backend's transactional primitives.

    Args:
        watchdog_interval: seconds between background watchdog sweeps; None disables the thread
            (callers then run :meth:`check_watchdog` themselves, as tests do).
        external_poll_interval: for backends that other processes write to (SQLite files,
            PostgreSQL), how often waiters re-check for changes made elsewhere. Changes made in
            this process always wake waiters at once.
    """

    def __init__(
        self, *, watchdog_interval: float | None = 0.5, external_poll_interval: float | None = None
    ) -> None:
        self._changed = threading.Condition()
        self._change_count = 0
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

    # ---- change notification -------------------------------------------------------------------
    def _notify(self) -> None:
        with self._changed:
            self._change_count += 1
            self._changed.notify_all()

    def _wait_until(self, check: Any, timeout: float | None) -> Any:
        """Re-run ``check`` after every change until it returns a truthy value or time runs out."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            with self._changed:
                seen = self._change_count
            result = check()
            if result:
                return result
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return result
            if self._external_poll is not None:
                remaining = self._external_poll if remaining is None else min(remaining, self._external_poll)
            with self._changed:
                if self._change_count == seen and not self._closed.is_set():
                    self._changed.wait(remaining)
            if self._closed.is_set():
                return check()

    # ---- rollouts -------------------------------------------------------------------------------
    def enqueue_rollouts(self, requests: Sequence[RolloutRequest | dict[str, Any]]) -> list[Rollout]:
        parsed = [r if isinstance(r, RolloutRequest) else RolloutRequest.model_validate(r) for r in requests]
        for index, request in enumerate(parsed):
            where = f"rollout {index}: " if len(parsed) > 1 else ""
            request.input = normalize_json(request.input, "input", where)
            request.metadata = _checked_metadata(normalize_json(request.metadata, "metadata", where), where)
        stamp = now()
        rollouts = [
            Rollout(
                rollout_id=request.rollout_id or new_id("ro"),
                input=request.input,
                mode=request.mode,
                resources_id=request.resources_id,
                config=request.config,
                metadata=request.metadata,
                enqueue_time=stamp,
            )
            for request in parsed
        ]
        ids = [r.rollout_id for r in rollouts]
        if len(set(ids)) != len(ids):
            raise AlreadyExistsError("a batch names the same rollout_id twice")
        with self._transaction() as tx:
            for rollout_id in ids:
                if tx.get_rollout(rollout_id) is not None:
                    raise AlreadyExistsError(f"rollout {rollout_id!r} already exists")
            tx.insert_rollouts(rollouts)
            tx.push_queue(ids)
        self._notify()
        return rollouts

    def dequeue_rollouts(
        self, limit: int, worker_id: str | None = None, timeout: float = 0.0
    ) -> list[AttemptedRollout]:
        if limit < 1:
            raise InvalidInputError(f"limit must be ≥ 1, got {limit}")
        claimed = self._wait_until(lambda: self._claim(limit, worker_id), timeout)
        return claimed or []

    def _claim(self, limit: int, worker_id: str | None) -> list[AttemptedRollout]:
        claimed: list[AttemptedRollout] = []
        with self._transaction() as tx:
            for rollout_id in tx.pop_queue(limit):
                rollout = tx.get_rollout(rollout_id)
                if rollout is None or not rollout.status.is_queued:
                    continue
                stamp = now()
                attempt = Attempt(
                    rollout_id=rollout_id,
                    attempt_id=new_id("at"),
                    sequence_id=rollout.num_attempts + 1,
                    worker_id=worker_id,
                    start_time=stamp,
                    last_heartbeat_time=stamp,
                )
                rollout.status = RolloutStatus.PREPARING
                rollout.num_attempts = attempt.sequence_id
                rollout.start_time = rollout.start_time or stamp
                rollout.reward = None
                rollout.llm_calls = 0
                tx.insert_attempt(attempt)
                tx.save_rollout(rollout)
                claimed.append(AttemptedRollout(rollout=rollout, attempt=attempt))
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

    def cancel_rollout(self, rollout_id: str) -> Rollout:
        with self._transaction() as tx:
            rollout = self._require_rollout(tx, rollout_id)
            if rollout.status.is_terminal:
                raise InvalidTransitionError("rollout", rollout_id, rollout.status.value, "cancelled")
            stamp = now()
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
                self._require_rollout(tx, rollout_id)
        done: list[Rollout] = []

        def all_done() -> bool:
            nonlocal done
            with self._transaction() as tx:
                current = [tx.get_rollout(rollout_id) for rollout_id in ids]
            done = [r for r in current if r is not None and r.status.is_terminal]
            return len(done) == len(ids)

        self._wait_until(all_done, timeout)
        return done

    # ---- attempts -------------------------------------------------------------------------------
    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        with self._transaction() as tx:
            self._require_rollout(tx, rollout_id)
            return tx.get_attempts(rollout_id)

    def update_attempt(
        self,
        rollout_id: str,
        attempt_id: str,
        status: AttemptStatus | str,
        error: AttemptError | None = None,
    ) -> Attempt:
        try:
            status = AttemptStatus(status)
        except ValueError:
            allowed = ", ".join(s.value for s in AttemptStatus)
            raise InvalidInputError(f"unknown attempt status {status!r} (allowed: {allowed})") from None
        with self._transaction() as tx:
            rollout = self._require_rollout(tx, rollout_id)
            attempt = self._require_attempt(tx, rollout_id, attempt_id)
            terminal_rollout = self._transition(tx, rollout, attempt, status, error)
        if terminal_rollout or status.is_terminal:
            self._notify()
        return attempt

    def _transition(
        self, tx: StoreTx, rollout: Rollout, attempt: Attempt, status: AttemptStatus, error: AttemptError | None
    ) -> bool:
        """Apply one attempt status change and its effect on the rollout; True if the queue or a
        rollout's terminal state changed (waiters must wake)."""
        if attempt.status == status:
            return False
        if attempt.status.is_terminal or status == AttemptStatus.PREPARING:
            raise InvalidTransitionError("attempt", attempt.attempt_id, attempt.status.value, status.value)
        stamp = now()
        attempt.status = status
        if status.is_terminal:
            attempt.end_time = stamp
            attempt.error = error or attempt.error
        else:
            attempt.last_heartbeat_time = stamp
        tx.save_attempt(attempt)

        is_latest = attempt.sequence_id == rollout.num_attempts
        if not is_latest or rollout.status.is_terminal or rollout.status.is_queued:
            return False
        if status == AttemptStatus.RUNNING:
            rollout.status = RolloutStatus.RUNNING
            tx.save_rollout(rollout)
            return False
        if status == AttemptStatus.SUCCEEDED:
            rollout.status = RolloutStatus.SUCCEEDED
        elif _RETRY_REASON[status] in rollout.config.retry_on and rollout.num_attempts < rollout.config.max_attempts:
            rollout.status = RolloutStatus.REQUEUING
            rollout.reward, rollout.llm_calls = None, 0  # results of the failed attempt don't carry over
            tx.push_queue([rollout.rollout_id])
        else:
            rollout.status = RolloutStatus.FAILED
        if rollout.status.is_terminal:
            rollout.end_time = stamp
        tx.save_rollout(rollout)
        return True

    def heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt:
        with self._transaction() as tx:
            self._require_rollout(tx, rollout_id)
            attempt = self._require_attempt(tx, rollout_id, attempt_id)
            if not attempt.status.is_terminal:
                attempt.last_heartbeat_time = now()
                tx.save_attempt(attempt)
            return attempt

    def check_watchdog(self) -> list[Attempt]:
        changed: list[Attempt] = []
        with self._transaction() as tx:
            stamp = now()
            for attempt in tx.active_attempts():
                rollout = tx.get_rollout(attempt.rollout_id)
                if rollout is None:
                    continue
                config = rollout.config
                last_sign = attempt.last_heartbeat_time or attempt.start_time
                if config.timeout_seconds is not None and stamp - attempt.start_time > config.timeout_seconds:
                    verdict, why = AttemptStatus.TIMEOUT, f"no result within {config.timeout_seconds} s"
                elif config.unresponsive_seconds is not None and stamp - last_sign > config.unresponsive_seconds:
                    verdict, why = AttemptStatus.UNRESPONSIVE, f"no heartbeat for {config.unresponsive_seconds} s"
                else:
                    continue
                error = AttemptError(type=verdict.value.capitalize(), message=f"watchdog: {why}")
                self._transition(tx, rollout, attempt, verdict, error)
                changed.append(attempt)
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
    def add_spans(self, spans: Sequence[Span | dict[str, Any]]) -> list[Span]:
        parsed = [s if isinstance(s, Span) else Span.model_validate(s) for s in spans]
        for index, span in enumerate(parsed):
            where = f"span {index} ({span.name}): " if len(parsed) > 1 else f"span {span.name!r}: "
            span.attributes = normalize_json(span.attributes, "attributes", where)
            span.resource = normalize_json(span.resource, "resource", where)
            for number, event in enumerate(span.events):
                event.attributes = normalize_json(event.attributes, f"events[{number}].attributes", where)
        by_rollout: dict[str, list[Span]] = {}
        for span in parsed:
            by_rollout.setdefault(span.rollout_id, []).append(span)
        stored_by_key: dict[tuple[str, str, str], Span] = {}
        wake = False
        with self._transaction() as tx:
            # Resolve every id before writing anything: a refused batch stores nothing.
            targets = {
                rollout_id: (
                    self._require_rollout(tx, rollout_id),
                    {aid: self._require_attempt(tx, rollout_id, aid) for aid in {s.attempt_id for s in group}},
                )
                for rollout_id, group in by_rollout.items()
            }
            for rollout_id, group in by_rollout.items():
                rollout, attempts = targets[rollout_id]
                results = tx.insert_spans(rollout_id, group)
                new_spans = [span for span, is_new in results if is_new]
                for span, _ in results:
                    stored_by_key[(span.rollout_id, span.attempt_id, span.span_id)] = span
                before = (rollout.status, rollout.reward, rollout.llm_calls)
                wake |= self._absorb_spans(tx, rollout, attempts, new_spans)
                if (rollout.status, rollout.reward, rollout.llm_calls) != before:
                    tx.save_rollout(rollout)
        if wake:
            self._notify()
        return [stored_by_key[(s.rollout_id, s.attempt_id, s.span_id)] for s in parsed]

    def _absorb_spans(self, tx: StoreTx, rollout: Rollout, attempts: dict[str, Attempt], spans: list[Span]) -> bool:
        """Spans are heartbeats; reward and LLM-call spans of the latest attempt update the rollout."""
        wake = False
        stamp = now()
        for attempt in attempts.values():
            if attempt.status.is_terminal or not any(s.attempt_id == attempt.attempt_id for s in spans):
                continue
            if attempt.status == AttemptStatus.PREPARING:
                wake |= self._transition(tx, rollout, attempt, AttemptStatus.RUNNING, None)
            elif stamp - (attempt.last_heartbeat_time or 0.0) >= HEARTBEAT_RESOLUTION_SECONDS:
                attempt.last_heartbeat_time = stamp
                tx.save_attempt(attempt)
        latest_id = next((a.attempt_id for a in attempts.values() if a.sequence_id == rollout.num_attempts), None)
        for span in spans:
            if span.attempt_id != latest_id:
                continue
            if span.name == semconv.SPAN_LLM_CALL:
                rollout.llm_calls += 1
            elif span.name == semconv.SPAN_REWARD:
                value = _number(span.attributes.get(semconv.REWARD_VALUE))
                if value is not None:
                    rollout.reward = value
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
            self._require_rollout(tx, rollout_id)
            if attempt_id == "latest":
                attempts = tx.get_attempts(rollout_id)
                if not attempts:
                    return []
                attempt_id = attempts[-1].attempt_id
            elif attempt_id is not None:
                self._require_attempt(tx, rollout_id, attempt_id)
            return tx.query_spans(rollout_id, attempt_id, name, after_sequence_id, limit)

    # ---- resources ------------------------------------------------------------------------------
    def add_resources(self, items: dict[str, Any], resources_id: str | None = None) -> Resources:
        for name, item in items.items():
            normalize_json(item.model_dump() if isinstance(item, BaseModel) else item, f"items.{name}")
        snapshot = Resources(resources_id=resources_id or new_id("res"), version=0, items=items)
        with self._transaction() as tx:
            if tx.get_resources(snapshot.resources_id) is not None:
                raise AlreadyExistsError(
                    f"resources {snapshot.resources_id!r} already exist; snapshots are immutable, "
                    "publish a new one instead"
                )
            latest = tx.latest_resources()
            snapshot.version = (latest.version if latest else 0) + 1
            snapshot.create_time = now()
            tx.insert_resources(snapshot)
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
        worker.metadata = normalize_json(worker.metadata, "metadata")
        with self._transaction() as tx:
            tx.save_worker(worker)
        return worker

    def query_workers(self) -> list[Worker]:
        with self._transaction() as tx:
            return tx.all_workers()

    def add_metrics(self, records: Sequence[MetricRecord | dict[str, Any]]) -> None:
        parsed = [r if isinstance(r, MetricRecord) else MetricRecord.model_validate(r) for r in records]
        for record in parsed:
            normalize_json(record.values, f"values of step {record.step}")
        with self._transaction() as tx:
            tx.insert_metrics(parsed)

    def query_metrics(self, run_id: str | None = None) -> list[MetricRecord]:
        with self._transaction() as tx:
            return tx.query_metrics(run_id)

    # ---- helpers --------------------------------------------------------------------------------
    @staticmethod
    def _require_rollout(tx: StoreTx, rollout_id: str) -> Rollout:
        rollout = tx.get_rollout(rollout_id)
        if rollout is None:
            raise NotFoundError("rollout", rollout_id)
        return rollout

    @staticmethod
    def _require_attempt(tx: StoreTx, rollout_id: str, attempt_id: str) -> Attempt:
        attempt = tx.get_attempt(rollout_id, attempt_id)
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

