"""Everything a store holds, as plain data: the durability tests compare it across a restart, the
fuzz tests before and after each refused call (a refusal must change nothing)."""

from __future__ import annotations

from typing import Any


def store_contents(store: Any) -> dict[str, Any]:
    """Rollouts, attempts, spans, resources (and the latest), workers and metrics of ``store``."""
    rollouts = store.query_rollouts()
    latest = store.get_latest_resources()
    return {
        "rollouts": [r.model_dump() for r in rollouts],
        "attempts": {r.rollout_id: [a.model_dump() for a in store.get_attempts(r.rollout_id)] for r in rollouts},
        "spans": {r.rollout_id: [s.model_dump() for s in store.query_spans(r.rollout_id)] for r in rollouts},
        "resources": [r.model_dump() for r in store.query_resources()],
        "latest": latest.model_dump() if latest else None,
        "workers": sorted((w.model_dump() for w in store.query_workers()), key=lambda w: w["worker_id"]),
        "metrics": [m.model_dump() for m in store.query_metrics()],
    }
