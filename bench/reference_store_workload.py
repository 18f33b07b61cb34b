"""bench_store.py's workload on the reference system's in-memory store (Agent Lightning).

Run by ``bench_store.py --reference-python PY`` under an interpreter that has ``agentlightning``
installed (``python -m venv /tmp/agl && /tmp/agl/bin/pip install agentlightning``: it is not a
dependency of this project, and its own dependencies would not belong in ours). It imports
nothing from agentgrad, prints one JSON object with the phases and key names of
``bench_store.py``, and is measured in the same run as our backends, so the ratio holds however
loaded the machine is.

Mapping of the phases onto ``InMemoryLightningStore`` (0.x, async API, ``thread_safe=True`` as a
store shared with runner threads needs): ``enqueue_rollout``; ``dequeue_rollout`` +
``update_attempt(status="running")``; ``add_span`` one by one; ``add_many_spans`` in batches of
10 and 1000; ``update_attempt(status="succeeded")``; ``query_spans`` of each rollout. Spans are
built outside the timed blocks, as for our backends, with their ``sequence_id`` already set (the
reference expects the caller to have fetched it, a store call per span that is not counted here:
this favours the reference).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from typing import Any

from store_workload import SPANS_PER_ROLLOUT, summarize  # bench/ is on sys.path


def _span(rollout_id: str, attempt_id: str, tag: str, index: int, sequence_id: int) -> Any:
    from agentlightning.types import OtelResource, Span, TraceStatus

    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id=f"{index:032x}",
        span_id=f"{tag}{index:04d}",
        parent_id=None,
        name="agentgrad.message",
        status=TraceStatus(status_code="UNSET"),
        attributes={"agentgrad.message.body": "x" * 100, "step": index},
        events=[],
        links=[],
        start_time=time.time(),
        end_time=None,
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )


async def run(n: int) -> dict[str, Any]:
    from agentlightning.store.memory import InMemoryLightningStore

    store = InMemoryLightningStore(thread_safe=True)
    results: dict[str, Any] = {}
    calls: dict[str, int] = {}
    seconds: dict[str, float] = {}

    async def phase(name: str, count: int, make: Any) -> Any:
        gc.collect()
        gc.freeze()
        start = time.perf_counter()
        out = await make()
        elapsed = time.perf_counter() - start
        calls[name], seconds[name] = count, elapsed
        results[name] = {"ops": count, "seconds": round(elapsed, 4), "ops_per_s": round(count / elapsed)}
        return out

    async def enqueue() -> None:
        for i in range(n):
            await store.enqueue_rollout(input={"task": i})

    async def dequeue_start() -> list[tuple[str, str]]:
        pairs = []
        for _ in range(n):
            claimed = await store.dequeue_rollout(worker_id="bench")
            await store.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="running")
            pairs.append((claimed.rollout_id, claimed.attempt.attempt_id))
        return pairs

    await phase("enqueue", n, enqueue)
    pairs = await phase("dequeue_start", 2 * n, dequeue_start)
    results["dequeue_start"]["rollouts_per_s"] = round(n / seconds["dequeue_start"])

    def spans(of: list[tuple[str, str]], tag: str, first_sequence_id: int) -> list[list[Any]]:
        return [[_span(r, a, tag, i, first_sequence_id + i) for i in range(SPANS_PER_ROLLOUT)] for r, a in of]

    singles = [s for batch in spans(pairs, "s", 1) for s in batch]

    async def add_singles() -> None:
        for span in singles:
            await store.add_span(span)

    async def succeed() -> None:
        for r, a in pairs:
            await store.update_attempt(r, a, status="succeeded")

    async def query() -> list[int]:
        return [len(await store.query_spans(r)) for r, _ in pairs]

    await phase("add_span_single", len(singles), add_singles)
    results["add_span_single"]["spans_per_s"] = results["add_span_single"]["ops_per_s"]
    await phase("update_succeeded", n, succeed)
    counts = await phase("query_spans", n, query)
    assert all(c == SPANS_PER_ROLLOUT for c in counts), f"lost spans: {counts[:5]}"

    # The batched phases: N more rollouts, claimed and started outside the timed blocks.
    await enqueue()
    batch_pairs = await dequeue_start()

    async def add_batches(batches: list[list[Any]]) -> None:
        for batch in batches:
            await store.add_many_spans(batch)

    batches10 = spans(batch_pairs, "b", 1)
    await phase("add_spans_batch10", n * SPANS_PER_ROLLOUT, lambda: add_batches(batches10))
    flat = [s for batch in spans(batch_pairs, "k", 1 + SPANS_PER_ROLLOUT) for s in batch]
    batches1000 = [flat[i : i + 1000] for i in range(0, len(flat), 1000)]
    await phase("add_spans_batch1000", len(flat), lambda: add_batches(batches1000))
    for name in ("add_spans_batch10", "add_spans_batch1000"):
        results[name]["spans_per_s"] = results[name]["ops_per_s"]

    summarize(results, calls, seconds)
    import agentlightning

    results["version"] = getattr(agentlightning, "__version__", "unknown")
    return results


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)  # the reference logs every retry-free call at INFO/WARNING
    print(json.dumps(asyncio.run(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))))
