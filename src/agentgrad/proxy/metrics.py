"""The proxy's counters: what ``/metrics`` and :attr:`LLMProxy.metrics` report."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    attempts: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def as_dict(self) -> dict[str, int]:
        values = {k: v for k, v in vars(self).items() if isinstance(v, int)}
        values["attempts_with_calls"] = len(self.attempts)
        return values
