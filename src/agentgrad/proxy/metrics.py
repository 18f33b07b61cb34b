"""The proxy's counters: what ``/metrics`` and :attr:`LLMProxy.metrics` report."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

#: Attempts :meth:`ProxyMetrics.recorded_calls_of` remembers to count each once: a proxy serves
#: long runs, and a set of every attempt it ever saw grew by ~250 bytes an attempt (a GB in four
#: million). An attempt recorded again after this many others is counted twice.
ATTEMPTS_REMEMBERED = 65_536


@dataclass
class ProxyMetrics:
    """Counters exposed at ``/metrics`` and on :attr:`LLMProxy.metrics`.

    ``unattributed`` (calls with no rollout: forwarded, not recorded) and ``missing_token_ids``
    (recorded calls the upstream gave no token ids for: untrainable) are the ones to watch — both
    mean an agent is producing no training data. ``store_errors`` counts spans lost after retries,
    ``store_retries`` retried store writes, ``store_batches`` store transactions (one per batch of
    spans in ``async`` record mode).
    """

    calls: int = 0
    recorded: int = 0
    unattributed: int = 0
    missing_token_ids: int = 0
    retries_deduplicated: int = 0
    rejected: int = 0
    upstream_errors: int = 0
    upstream_unreachable: int = 0
    #: Calls the upstream took longer than ``upstream_timeout`` to answer (answered 504).
    upstream_timeouts: int = 0
    store_errors: int = 0
    store_batches: int = 0
    store_retries: int = 0
    streams_aborted: int = 0
    #: Distinct attempts with a recorded call (see :data:`ATTEMPTS_REMEMBERED`).
    attempts_with_calls: int = 0
    _recent: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def recorded_calls_of(self, keys: list[tuple[str, str]]) -> None:
        """Count recorded calls, by their ``(rollout_id, attempt_id)`` (from the span writer's
        thread, or the serving thread in ``sync`` record mode)."""
        with self._lock:
            self.recorded += len(keys)
            recent = self._recent
            for key in keys:
                if key in recent:
                    recent.move_to_end(key)
                    continue
                self.attempts_with_calls += 1
                recent[key] = None
                if len(recent) > ATTEMPTS_REMEMBERED:
                    recent.popitem(last=False)

    def recorded_a_call_of(self, key: tuple[str, str]) -> bool:
        """Whether a call of the attempt was recorded (False also once it is forgotten: see
        :data:`ATTEMPTS_REMEMBERED`)."""
        with self._lock:
            return key in self._recent

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}
