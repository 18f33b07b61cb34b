"""MemoryStore: the fastest backend, for tests, notebooks and single-process runs.

Nothing survives the process. Records are copied in and out so callers can never mutate stored
state by accident.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel

from agentgrad.store.core import StoreTx, TransactionalStore
from agentgrad.store.protocol import RolloutFilter
from agentgrad.store.query import filter_and_page
from agentgrad.types import Attempt, MetricRecord, Resources, Rollout, Span, Worker


class _MemoryData:
    def __init__(self) -> None:
        self.rollouts: dict[str, Rollout] = {}
        self.queue: OrderedDict[str, None] = OrderedDict()
        self.attempts: dict[str, list[Attempt]] = {}
        self.spans: dict[str, list[Span]] = {}
        self.span_keys: dict[tuple[str, str, str], Span] = {}
        self.resources: dict[str, Resources] = {}
        self.resources_order: list[str] = []
        self.workers: dict[str, Worker] = {}
        self.metrics: list[MetricRecord] = []


_CONTAINERS = (dict, list, BaseModel)


def _copy(value: Any) -> Any:
    """A deep copy of a record, several times faster than ``copy.deepcopy``.

    Records hold JSON-shaped data (dicts, lists, scalars) and nested models, so only those
    containers need copying; scalars and tuples are immutable and are shared.
    """
    if isinstance(value, BaseModel):
        clone = value.__copy__()  # copies __dict__ itself
        fields = clone.__dict__
        for key, item in fields.items():
            if isinstance(item, _CONTAINERS):
                fields[key] = _copy(item)
        return clone
    if isinstance(value, dict):
        return {k: _copy(v) if isinstance(v, _CONTAINERS) else v for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) if isinstance(v, _CONTAINERS) else v for v in value]
    return value


class _MemoryTx(StoreTx):
    """Primitives over plain dicts. The store's lock makes each transaction atomic; the core
    validates before it mutates, so no rollback is needed."""

    def __init__(self, data: _MemoryData) -> None:
        self.d = data

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        found = self.d.rollouts.get(rollout_id)
        return _copy(found) if found is not None else None

    def insert_rollouts(self, rollouts: Sequence[Rollout]) -> None:
        for rollout in rollouts:
            self.d.rollouts[rollout.rollout_id] = _copy(rollout)
            self.d.attempts[rollout.rollout_id] = []
            self.d.spans[rollout.rollout_id] = []

    def save_rollout(self, rollout: Rollout) -> None:
        self.d.rollouts[rollout.rollout_id] = _copy(rollout)

    def push_queue(self, rollout_ids: Sequence[str]) -> None:
        for rollout_id in rollout_ids:
            self.d.queue[rollout_id] = None

    def pop_queue(self, limit: int) -> list[str]:
        return [self.d.queue.popitem(last=False)[0] for _ in range(min(limit, len(self.d.queue)))]

    def remove_from_queue(self, rollout_id: str) -> None:
        self.d.queue.pop(rollout_id, None)

    def query_rollouts(self, filter: RolloutFilter) -> list[Rollout]:
        return [_copy(r) for r in filter_and_page(self.d.rollouts.values(), filter)]

    def count_rollouts(self, filter: RolloutFilter) -> int:
        return len(filter_and_page(self.d.rollouts.values(), filter.model_copy(update={"limit": None, "offset": 0})))

    def get_attempt(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        for attempt in self.d.attempts.get(rollout_id, ()):
            if attempt.attempt_id == attempt_id:
                return _copy(attempt)
        return None

    def get_attempts(self, rollout_id: str) -> list[Attempt]:
        return [_copy(a) for a in self.d.attempts.get(rollout_id, ())]

    def insert_attempt(self, attempt: Attempt) -> None:
        self.d.attempts[attempt.rollout_id].append(_copy(attempt))

    def save_attempt(self, attempt: Attempt) -> None:
        attempts = self.d.attempts[attempt.rollout_id]
        attempts[attempt.sequence_id - 1] = _copy(attempt)

    def active_attempts(self) -> list[Attempt]:
        active = []
        for rollout_id, rollout in self.d.rollouts.items():
            attempts = self.d.attempts[rollout_id]
            if rollout.status.value in ("preparing", "running") and attempts and not attempts[-1].status.is_terminal:
                active.append(_copy(attempts[-1]))
        return active

    def insert_spans(self, rollout_id: str, spans: Sequence[Span]) -> list[tuple[Span, bool]]:
        stored = self.d.spans[rollout_id]
        results = []
        for span in spans:
            key = (span.rollout_id, span.attempt_id, span.span_id)
            existing = self.d.span_keys.get(key)
            if existing is not None:
                results.append((_copy(existing), False))
                continue
            copy = _copy(span)
            copy.sequence_id = len(stored) + 1
            stored.append(copy)
            self.d.span_keys[key] = copy
            # The caller's own span (already normalized by the core) with its new sequence id:
            # the stored copy stays private without a second deep copy.
            results.append((span.model_copy(update={"sequence_id": copy.sequence_id}), True))
        return results

    def query_spans(
        self, rollout_id: str, attempt_id: str | None, name: str | None, after_sequence_id: int, limit: int | None
    ) -> list[Span]:
        selected = (
            s
            for s in itertools.islice(self.d.spans.get(rollout_id, ()), max(0, after_sequence_id), None)
            if (attempt_id is None or s.attempt_id == attempt_id) and (name is None or s.name == name)
        )
        return [_copy(s) for s in itertools.islice(selected, limit)]

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


class MemoryStore(TransactionalStore):
    """An in-process store backed by dictionaries under one lock."""

    def __init__(self, *, watchdog_interval: float | None = 0.5) -> None:
        self._lock = threading.RLock()
        self._data = _MemoryData()
        super().__init__(watchdog_interval=watchdog_interval)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[StoreTx]:
        with self._lock:
            yield _MemoryTx(self._data)
