"""What ``bench_store.py`` and ``reference_store_workload.py`` share: the workload's shape and how
its figures are summed up. Imports nothing of agentgrad: the reference workload runs it under
another interpreter."""

from __future__ import annotations

import resource
from typing import Any

SPANS_PER_ROLLOUT = 10
#: The calls of one rollout's lifecycle, one store call each (``mixed_unbatched`` sums them).
LIFECYCLE = ("enqueue", "dequeue_start", "add_span_single", "update_succeeded", "query_spans")


def summarize(results: dict[str, Any], calls: dict[str, int], seconds: dict[str, float]) -> dict[str, Any]:
    """Add ``mixed_unbatched`` (the lifecycle's calls over their total time) and peak RSS."""
    total_calls = sum(calls[p] for p in LIFECYCLE)
    total_seconds = sum(seconds[p] for p in LIFECYCLE)
    results["mixed_unbatched"] = {
        "ops": total_calls,
        "seconds": round(total_seconds, 3),
        "ops_per_s": round(total_calls / total_seconds),
    }
    results["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return results
