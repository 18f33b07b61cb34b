"""MemoryStore: the fastest backend, for tests, notebooks and single-process runs.

Nothing survives the process (idempotency records neither: they are as durable as the data).
Callers can never mutate stored state by accident: rollouts, attempts and the other few, often
updated records are deep-copied in and out; spans, the bulk of the data and never changed once
stored, are kept as their JSON text, as the SQL backends keep them. Text is compact and invisible
to the cyclic garbage collector, whose sweeps over hundreds of thousands of live span objects
would otherwise cost more than the store's own work.
"""

from __future__ import annotations

import copy
import enum
import functools
import itertools
import threading
import types
import typing
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from pydantic import BaseModel

from agentgrad.store.core import (
    AttemptClock,
    StoreTx,
    TransactionalStore,
    assembled,
    evolved,
    from_json,
    from_json_many,
    to_json,
)
from agentgrad.store.protocol import RolloutFilter
from agentgrad.store.query import filter_and_page
from agentgrad.types import Attempt, AttemptStatus, MetricRecord, Resources, Rollout, RolloutStatus, Span, Worker, now


class _SpanLog:
    """One rollout's spans in ``sequence_id`` order, as JSON text with the two fields queries
    filter on, in parallel lists: only strings and bytes, which the garbage collector ignores."""

    __slots__ = ("attempt_ids", "names", "texts", "positions")

    def __init__(self) -> None:
        self.attempt_ids: list[str] = []
        self.names: list[str] = []
        self.texts: list[bytes] = []
        #: ``attempt_id NUL span_id`` → index; attempt ids are the store's own, without NULs.
        self.positions: dict[str, int] = {}

    def append(self, key: str, span: Span, text: bytes) -> None:
        """Store ``span``'s ``text`` under ``key``, its ``attempt_id NUL span_id``."""
        self.positions[key] = len(self.texts)
        self.attempt_ids.append(span.attempt_id)
        self.names.append(span.name)
        self.texts.append(text)

    def select(
        self, attempt_id: str | None, name: str | None, after_sequence_id: int, limit: int | None
    ) -> Iterable[bytes]:
        """The texts after ``after_sequence_id`` (the index of the next one: sequence ids count
        from 1), at most ``limit``; a page without filters is one slice, not a copy of the rest."""
        start = max(0, after_sequence_id)
        if attempt_id is None and name is None:
            return self.texts[start:] if limit is None else self.texts[start : start + limit]
        selected = (
            self.texts[index]
            for index in range(start, len(self.texts))
            if (attempt_id is None or self.attempt_ids[index] == attempt_id)
            and (name is None or self.names[index] == name)
        )
        return selected if limit is None else itertools.islice(selected, limit)


class _MemoryData:
    def __init__(self) -> None:
        self.rollouts: dict[str, Rollout] = {}
        self.queue: OrderedDict[str, None] = OrderedDict()
        self.attempts: dict[str, list[Attempt]] = {}
        self.spans: dict[str, _SpanLog] = {}
        self.resources: dict[str, Resources] = {}
        self.resources_order: list[str] = []
        self.workers: dict[str, Worker] = {}
        self.metrics: list[MetricRecord] = []
        #: Idempotency records, oldest first: (scope, key) → (fingerprint, answer JSON, stamp).
        self.replays: OrderedDict[tuple[str, str], tuple[str, str, float]] = OrderedDict()
        self.replay_chars = 0


#: The most characters of recorded answers kept in memory; the oldest records go first beyond it
#: (the SQL backends keep theirs on disk, bounded by count and age only).
MAX_REPLAY_CHARS = 64 * 1024 * 1024


#: Exact types whose values are immutable, so a copy may share them. Everything else in a
#: record is a dict, a list or a nested model (JSON values are normalized before they are stored).
_SHARED = frozenset({str, int, float, bool, type(None), RolloutStatus, AttemptStatus})


def _copy(value: Any) -> Any:
    """A deep copy of a record, several times faster than ``copy.deepcopy`` or ``model_copy``.

    Dispatches on exact types: scalars and enums are shared, dicts and lists are rebuilt, models
    are copied by their class's own copier (:func:`_model_copier`).
    """
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _SHARED else _copy(v) for k, v in value.items()} if value else {}
    if kind is list:
        return [v if type(v) in _SHARED else _copy(v) for v in value] if value else []
    if kind in _SHARED:
        return value
    if BaseModel in kind.__mro__:
        return _model_copier(cast(type[BaseModel], kind))(value)
    return copy.deepcopy(value)  # anything else a plain ``Any`` field may hold


@functools.cache
def _model_copier(model: type[BaseModel]) -> Callable[[BaseModel], BaseModel]:
    """The deep-copy function of one model class: its fields' dict copied, and only the fields
    whose type allows a container visited (models rebuilt without re-validation, see
    :func:`assembled`)."""
    nested = _nested_fields(model)

    def copy_model(value: BaseModel) -> BaseModel:
        fields = value.__dict__.copy()
        for key in nested:
            item = fields[key]
            if type(item) not in _SHARED:
                fields[key] = _copy(item)
        return assembled(model, fields, set(value.__pydantic_fields_set__))

    return copy_model


@functools.cache
def _nested_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` whose declared type allows a dict, list or model."""
    return tuple(name for name, field in model.model_fields.items() if not _is_scalar(field.annotation))


def _is_scalar(annotation: Any) -> bool:
    """Whether every value of the type ``annotation`` is immutable (``str | None``, enums, …)."""
    if annotation in _SHARED or (isinstance(annotation, type) and issubclass(annotation, enum.Enum)):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return all(type(choice) in _SHARED for choice in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return all(_is_scalar(member) for member in typing.get_args(annotation))
    return False


class _MemoryTx(StoreTx):
    """Primitives over plain dicts. The store's lock makes each transaction atomic; the core
    validates before it mutates, so no rollback is needed."""

    def __init__(self, data: _MemoryData) -> None:
        self.d = data

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        found = self.d.rollouts.get(rollout_id)
        return _copy(found) if found is not None else None

    def peek_rollout(self, rollout_id: str) -> Rollout | None:
        return self.d.rollouts.get(rollout_id)

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        for rollout in rollouts:
            self.d.rollouts[rollout.rollout_id] = _copy(rollout)
            self.d.attempts[rollout.rollout_id] = []
            self.d.spans[rollout.rollout_id] = _SpanLog()

    def save_rollout(self, rollout: Rollout, *, private: bool = False) -> None:
        self.d.rollouts[rollout.rollout_id] = rollout if private else _copy(rollout)

    def push_queue(self, rollout_ids: Sequence[str]) -> None:
        for rollout_id in rollout_ids:
            self.d.queue[rollout_id] = None

    def has_queued(self) -> bool:
        return bool(self.d.queue)

    def pop_queue(self, limit: int) -> list[str]:
        return [self.d.queue.popitem(last=False)[0] for _ in range(min(limit, len(self.d.queue)))]

    def remove_from_queue(self, rollout_id: str) -> None:
        self.d.queue.pop(rollout_id, None)

    def query_rollouts(self, filter: RolloutFilter) -> list[Rollout]:
        return [_copy(r) for r in filter_and_page(self.d.rollouts.values(), filter)]

    def count_rollouts(self, filter: RolloutFilter) -> int:
        return len(filter_and_page(self.d.rollouts.values(), filter.model_copy(update={"limit": None, "offset": 0})))

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        found = self.peek_attempt(rollout_id, attempt_id)
        return _copy(found) if found is not None else None

    def peek_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        for attempt in self.d.attempts.get(rollout_id, ()):
            if attempt.attempt_id == attempt_id:
                return attempt
        return None

    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        return [_copy(a) for a in self.d.attempts.get(rollout_id, ())]

    def insert_attempt(self, attempt: Attempt) -> None:
        self.d.attempts[attempt.rollout_id].append(_copy(attempt))

    def save_attempt(self, attempt: Attempt, *, private: bool = False) -> None:
        attempts = self.d.attempts[attempt.rollout_id]
        attempts[attempt.sequence_id - 1] = attempt if private else _copy(attempt)

    def attempt_clocks(self) -> list[AttemptClock]:
        clocks = []
        for rollout_id, attempts in self.d.attempts.items():
            if not attempts or attempts[-1].status.is_terminal:
                continue
            config = self.d.rollouts[rollout_id].config
            if config.timeout_seconds is not None or config.unresponsive_seconds is not None:
                latest = attempts[-1]
                clocks.append(
                    AttemptClock(
                        rollout_id,
                        latest.attempt_id,
                        latest.start_time,
                        latest.last_heartbeat_time,
                        config.timeout_seconds,
                        config.unresponsive_seconds,
                    )
                )
        return clocks

    def insert_spans(self, rollout_id: str, spans: Sequence[Span]) -> list[tuple[Span, bool]]:
        log = self.d.spans[rollout_id]
        results = []
        for span in spans:
            key = f"{span.attempt_id}\0{span.span_id}"
            position = log.positions.get(key)
            if position is not None:
                results.append((from_json(Span, log.texts[position]), False))
                continue
            # The caller gets its own span (already normalized by the core) numbered; the store
            # keeps that span's text, which nothing can reach.
            returned = evolved(span, sequence_id=len(log.texts) + 1)
            log.append(key, returned, to_json(returned))
            results.append((returned, True))
        return results

    def query_spans(
        self, rollout_id: str, attempt_id: str | None, name: str | None, after_sequence_id: int, limit: int | None
    ) -> list[Span]:
        log = self.d.spans.get(rollout_id)
        if log is None:
            return []
        return from_json_many(Span, log.select(attempt_id, name, after_sequence_id, limit))

    def get_resources(self, resources_id: str) -> Resources | None:
        found = self.d.resources.get(resources_id)
        return _copy(found) if found is not None else None

    def latest_resources(self) -> Resources | None:
        return self.get_resources(self.d.resources_order[-1]) if self.d.resources_order else None

    def insert_resources(self, resources: Resources) -> None:
        self.d.resources[resources.resources_id] = _copy(resources)
        self.d.resources_order.append(resources.resources_id)

    def all_resources(self) -> list[Resources]:
        return [_copy(self.d.resources[rid]) for rid in self.d.resources_order]

    def save_worker(self, worker: Worker) -> None:
        self.d.workers[worker.worker_id] = _copy(worker)

    def all_workers(self) -> list[Worker]:
        return [_copy(w) for w in self.d.workers.values()]

    def insert_metrics(self, records: Sequence[MetricRecord]) -> None:
        self.d.metrics.extend(_copy(r) for r in records)

    def query_metrics(self, run_id: str | None) -> list[MetricRecord]:
        return [_copy(r) for r in self.d.metrics if run_id is None or r.run_id == run_id]

    def find_replay(self, scope: str, key: str) -> tuple[str, str] | None:
        found = self.d.replays.get((scope, key))
        return None if found is None else (found[0], found[1])

    def save_replay(self, scope: str, key: str, fingerprint: str, answer: str, stamp: float) -> None:
        self.d.replays[(scope, key)] = (fingerprint, answer, stamp)
        self.d.replay_chars += len(answer)
        self._drop_oldest_replays(lambda: self.d.replay_chars > MAX_REPLAY_CHARS)

    def prune_replays(self, expired_before: float, keep: int) -> None:
        replays = self.d.replays
        self._drop_oldest_replays(lambda: len(replays) > keep or next(iter(replays.values()))[2] < expired_before)

    def _drop_oldest_replays(self, too_many: Callable[[], bool]) -> None:
        replays = self.d.replays
        while replays and too_many():
            _, (_, answer, _) = replays.popitem(last=False)
            self.d.replay_chars -= len(answer)


class _Locked:
    """The store's lock as a context manager that yields the transaction: a plain class, as
    ``contextlib.contextmanager`` would cost more than a whole in-memory span insert."""

    __slots__ = ("_lock", "_tx")

    def __init__(self, lock: threading.RLock, tx: _MemoryTx) -> None:
        self._lock, self._tx = lock, tx

    def __enter__(self) -> _MemoryTx:
        self._lock.acquire()
        return self._tx

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class MemoryStore(TransactionalStore):
    """An in-process store backed by dictionaries under one lock."""

    def __init__(self, *, watchdog_interval: float | None = 0.5, clock: Callable[[], float] = now) -> None:
        self._locked = _Locked(threading.RLock(), _MemoryTx(_MemoryData()))
        super().__init__(watchdog_interval=watchdog_interval, clock=clock)

    def _transaction(self) -> _Locked:
        return self._locked

    @property
    def in_process(self) -> bool:
        return True
