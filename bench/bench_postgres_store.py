"""PostgresStore in-process throughput: ops/s and p50/p99 latency, 1 and 4 threads, in a scratch schema.

    python bench/bench_postgres_store.py [--url postgresql://postgres@127.0.0.1:5432/test] [--ops 1000]

The code measured is this checkout's ``src``, or the first PYTHONPATH entry when one is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# This checkout's src, or the first PYTHONPATH entry (a copy of other code, to compare back to back).
sys.path.insert(
    0, os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(Path(__file__).resolve().parents[1] / "src")
)

from bench_http_store import run  # noqa: E402  (same timing harness)

from agentgrad.store.postgres import PostgresStore  # noqa: E402
from agentgrad.types import Span  # noqa: E402


def bench(url: str, schema: str, n_threads: int, ops: int) -> dict:
    stores = [PostgresStore(url, schema=schema, watchdog_interval=None, pool_size=2) for _ in range(n_threads)]
    per = ops // n_threads
    me = os.getpid()  # the store runs in this process: its "server" CPU is ours
    claims: dict[int, list] = {id(s): [] for s in stores}
    out = {"enqueue": run(stores, per, lambda s, i: len([s.enqueue_rollout({"i": i})]), me)}

    def dequeue_start(s: PostgresStore, i: int) -> int:
        got = s.dequeue_rollout()
        s.update_attempt(got.rollout.rollout_id, got.attempt.attempt_id, "running")
        claims[id(s)].append(got)
        return 1

    out["dequeue+start"] = run(stores, per, dequeue_start, me, calls_per_op=2)

    def span(s: PostgresStore, i: int) -> Span:
        c = claims[id(s)][i % len(claims[id(s)])]
        return Span(
            rollout_id=c.rollout.rollout_id,
            attempt_id=c.attempt.attempt_id,
            name="step",
            attributes={"tokens": list(range(64))},
        )

    out["add_span"] = run(stores, per, lambda s, i: len(s.add_spans([span(s, i)])), me)
    out["add_spans_batch200"] = run(
        stores,
        max(1, per // 20),
        lambda s, i: len(
            s.add_spans(
                [span(s, i)] * 1
                + [span(s, i).model_copy(update={"span_id": uuid.uuid4().hex[:16]}) for _ in range(199)]
            )
        ),
        me,
    )
    out["get_rollout"] = run(stores, per, lambda s, i: (s.get_rollout(claims[id(s)][i].rollout.rollout_id), 1)[1], me)
    for s in stores:
        s.close()
    return out


def main() -> None:
    import psycopg

    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--ops", type=int, default=1000)
    args = parser.parse_args()
    results = {}
    for n in (1, 4):
        schema = f"agbench_{uuid.uuid4().hex[:10]}"
        try:
            results[f"threads_{n}"] = bench(args.url, schema, n, args.ops)
        finally:
            with psycopg.connect(args.url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
