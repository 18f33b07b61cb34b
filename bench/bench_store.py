"""Store throughput per backend: ops/s for the calls a training run makes, and peak RSS.

    python bench/bench_store.py            # N=5000 rollouts x 10 spans, memory and sqlite
    python bench/bench_store.py --n 500 --backends sqlite
    python bench/bench_store.py --n 200 --backends memory,sqlite,postgres,redis   # + the machine's servers
    python bench/bench_store.py --reference-python /tmp/agl/bin/python   # + Agent Lightning, same run
    python bench/bench_store.py --instructions      # instructions per call (callgrind), N=200
    python bench/bench_store.py --instructions --keyed   # the same with idempotency keys

Each backend runs in a fresh child process (so peak RSS is its own), on N rollouts of 10 spans
each, as the issue states the workload. The lifecycle phases, in order: enqueue (one call per
rollout), dequeue+start (dequeue_rollout + update_attempt running), spans one by one (add_span,
10 per rollout), a dequeue that finds nothing queued (an idle runner slot's look), update status
(succeeded), query spans (the 10 spans of each rollout).
"mixed_unbatched" is every call of that lifecycle over their total time. The batched phases
write to N other rollouts (claimed and started untimed): 10 spans per rollout in one call each,
then 10 more per rollout in calls of 1000 — so that every phase measures just what it names, and
a query reads a rollout of the workload's size. SQLite is a file in WAL mode with the default
synchronous=NORMAL (durable against process crashes) and its background watchdog on, as in a
real run. "postgres" and "redis" run against the servers at ``--pg-url`` and ``--redis-url`` (the
machine's; a scratch schema or key prefix, deleted afterwards), watchdog on too; keep N small
for them on a loaded machine: a rollout left silent for 30 s between its phases is ended
``unresponsive`` by the watchdog (the default limit) and the run stops. Prints one JSON object.

``--reference-python PY`` also runs the same workload on the reference system's in-memory store
(``reference_store_workload.py``, under an interpreter that has ``agentlightning``) in the same
run and reports our figures as multiples of its own: on a shared machine whose speed moves by a
third from one hour to the next, that ratio is what compares with the issue's reference figures.

``--instructions`` reports instructions per call of each phase instead of time (the workload
under callgrind, see ``callgrind.py``): they do not move with the machine's load, so they compare
two versions of the code exactly; system calls are not counted.

``--keyed`` gives every replayable write of the lifecycle (enqueue, dequeue) an idempotency key
of its own, as the store service does for a ``StoreClient``'s writes: the store then also
looks the key up and records the answer in the write's transaction (see
``agentgrad.store.idempotency``). Compare it with a run without it for the cost of that record.

Garbage collection: each phase starts after a full collection and ``gc.freeze()``, so the
collections a phase triggers scan what that phase allocates, not the harness's own inputs (up
to 100k prebuilt span objects, which no real runner holds; re-scanning them was a fifth of a
single-span insert) nor what earlier phases left. ``--gc-scan-all`` measures without freezing.

The code measured is this checkout's ``src``, or the first PYTHONPATH entry when one is set (to
compare a baseline copy with the working tree back to back: machine load varies minute to minute).
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(ROOT / "src"))

from store_workload import LIFECYCLE, SPANS_PER_ROLLOUT, summarize  # noqa: E402 (bench/ is on sys.path)

PG_URL = os.environ.get("AGENTGRAD_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("AGENTGRAD_BENCH_REDIS", "redis://127.0.0.1:6379/0")
SCRATCH = f"bench_{os.getpid()}"  # the schema or key prefix of a server backend's run


def _open(backend: str, tmp: str, watchdog: bool) -> Any:
    interval = 0.5 if watchdog else None
    if backend == "memory":
        from agentgrad.store.memory import MemoryStore

        return MemoryStore(watchdog_interval=interval)
    if backend == "postgres":
        from agentgrad.store.postgres import PostgresStore

        atexit.register(_drop_scratch, backend)
        return PostgresStore(PG_URL, schema=SCRATCH, watchdog_interval=interval)
    if backend == "redis":
        from agentgrad.store.redis import RedisStore

        atexit.register(_drop_scratch, backend)
        return RedisStore(REDIS_URL, prefix=SCRATCH, watchdog_interval=interval)
    from agentgrad.store.sqlite import SqliteStore

    return SqliteStore(os.path.join(tmp, "bench.db"), watchdog_interval=interval)


def _drop_scratch(backend: str) -> None:
    """Delete a server backend's scratch schema or key prefix (at exit, also after a failure)."""
    if backend == "redis":
        from agentgrad.store.redis import RedisStore

        scratch = RedisStore(REDIS_URL, prefix=SCRATCH, watchdog_interval=None)
        scratch.drop()
        scratch.close()
    elif backend == "postgres":
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCRATCH}" CASCADE')


def _span(rollout_id: str, attempt_id: str, tag: str, index: int) -> Any:
    from agentgrad.types import Span

    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=f"{tag}{index:04d}",
        name="agentgrad.message",
        attributes={"agentgrad.message.body": "x" * 100, "step": index},
    )


def run_backend(backend: str, n: int, freeze: bool = True, counter: Any = None, keyed: bool = False) -> dict[str, Any]:
    """The workload on one backend; ``counter``: a ``callgrind.PhaseCounter`` bracketing each
    phase (the figures are then the instruction counts it dumps, not these times); ``keyed``:
    enqueue and dequeue carry idempotency keys."""
    from agentgrad.store.protocol import RolloutFilter
    from agentgrad.types import AttemptStatus, RolloutStatus

    results: dict[str, Any] = {}
    calls: dict[str, int] = {}
    seconds: dict[str, float] = {}

    def phase(name: str, count: int, fn: Any) -> Any:
        # Settle the garbage collector first (see the module docstring): the inputs built just
        # before would otherwise be swept inside the timed block.
        gc.collect()
        if freeze:
            gc.freeze()
        if counter is not None:
            counter.start()
        start = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - start
        if counter is not None:
            counter.end(name)
        calls[name], seconds[name] = count, elapsed
        results[name] = {"ops": count, "seconds": round(elapsed, 4), "ops_per_s": round(count / elapsed)}
        return out

    with tempfile.TemporaryDirectory() as tmp:
        # Counted runs leave out the watchdog thread: its sweeps would land in whichever phase runs.
        store = _open(backend, tmp, watchdog=counter is None)
        # Keys are made before the timed blocks, like the spans below.
        enqueue_keys = [f"enqueue-{i}" if keyed else None for i in range(n)]
        dequeue_keys = [f"dequeue-{i}" if keyed else None for i in range(n)]
        phase(
            "enqueue",
            n,
            lambda: [store.enqueue_rollout({"task": i}, idempotency_key=enqueue_keys[i]) for i in range(n)],
        )

        def dequeue_start() -> list[Any]:
            claimed = []
            for key in dequeue_keys:
                c = store.dequeue_rollout("bench", idempotency_key=key)
                store.update_attempt(c.rollout.rollout_id, c.attempt.attempt_id, AttemptStatus.RUNNING)
                claimed.append(c)
            return claimed

        claimed = phase("dequeue_start", 2 * n, dequeue_start)
        results["dequeue_start"]["rollouts_per_s"] = round(n / seconds["dequeue_start"])
        # A look that finds nothing queued: what each idle runner slot's long poll makes every
        # ``external_poll_interval`` (SQL, Redis) or after every change (memory).
        phase("dequeue_empty", n, lambda: [store.dequeue_rollout("bench") for _ in range(n)])
        pairs = [(c.rollout.rollout_id, c.attempt.attempt_id) for c in claimed]

        # Spans are built outside the timed block: the phase measures the store, not pydantic.
        singles = [_span(r, a, "s", i) for r, a in pairs for i in range(SPANS_PER_ROLLOUT)]
        phase("add_span_single", len(singles), lambda: [store.add_span(s) for s in singles])
        results["add_span_single"]["spans_per_s"] = results["add_span_single"]["ops_per_s"]
        phase("update_succeeded", n, lambda: [store.update_attempt(r, a, AttemptStatus.SUCCEEDED) for r, a in pairs])
        counts = phase("query_spans", n, lambda: [len(store.query_spans(r)) for r, _ in pairs])
        assert all(c == SPANS_PER_ROLLOUT for c in counts), "lost spans"

        # The batched phases: N more rollouts, claimed and started outside the timed blocks.
        batch_pairs = []
        for start in range(0, n, 500):
            store.enqueue_rollouts([{"input": {"task": i}} for i in range(start, min(n, start + 500))])
            for c in store.dequeue_rollouts(500, "bench"):
                store.update_attempt(c.rollout.rollout_id, c.attempt.attempt_id, AttemptStatus.RUNNING)
                batch_pairs.append((c.rollout.rollout_id, c.attempt.attempt_id))
        batches10 = [[_span(r, a, "b", i) for i in range(SPANS_PER_ROLLOUT)] for r, a in batch_pairs]
        phase("add_spans_batch10", n * SPANS_PER_ROLLOUT, lambda: [store.add_spans(b) for b in batches10])
        flat = [_span(r, a, "k", i) for r, a in batch_pairs for i in range(SPANS_PER_ROLLOUT)]
        batches1000 = [flat[i : i + 1000] for i in range(0, len(flat), 1000)]
        phase("add_spans_batch1000", len(flat), lambda: [store.add_spans(b) for b in batches1000])
        for name, calls_made in (("add_spans_batch10", n), ("add_spans_batch1000", len(batches1000))):
            results[name]["spans_per_s"] = results[name]["ops_per_s"]
            results[name]["calls_per_s"] = round(calls_made / seconds[name])
        assert all(len(store.query_spans(r)) == 2 * SPANS_PER_ROLLOUT for r, _ in batch_pairs[:50]), "lost spans"
        assert store.count_rollouts(RolloutFilter(status=[RolloutStatus.SUCCEEDED])) == n, "unfinished rollouts"
        store.close()

    summarize(results, calls, seconds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n",
        type=int,
        help="rollouts of the lifecycle, and as many for the batches (default 5000; 200 with --instructions)",
    )
    parser.add_argument("--backends", default="memory,sqlite", help="any of memory, sqlite, postgres, redis")
    parser.add_argument("--pg-url", default=PG_URL, help="the PostgreSQL of the postgres backend")
    parser.add_argument("--redis-url", default=REDIS_URL, help="the Redis of the redis backend")
    parser.add_argument(
        "--gc-scan-all", action="store_true", help="do not freeze the objects that exist when a phase starts"
    )
    parser.add_argument(
        "--reference-python", metavar="PY", help="an interpreter with agentlightning installed: run the reference too"
    )
    parser.add_argument("--instructions", action="store_true", help="count instructions per call (callgrind)")
    parser.add_argument("--keyed", action="store_true", help="enqueue and dequeue with idempotency keys")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = args.n or (200 if args.instructions else 5000)
    if args.child:
        counter = None
        if args.instructions:
            from callgrind import PhaseCounter

            counter = PhaseCounter()
        print(json.dumps(run_backend(args.child, n, freeze=not args.gc_scan_all, counter=counter, keyed=args.keyed)))
        return
    keyed = ["--keyed"] if args.keyed else []
    if args.instructions:
        print(json.dumps(count_instructions(args.backends.split(","), n, keyed), indent=2))
        return
    import sqlite3

    report: dict[str, Any] = {
        "n_rollouts": n,
        "spans_per_rollout": SPANS_PER_ROLLOUT,
        "gc": "scan all" if args.gc_scan_all else "frozen at each phase start",
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "idempotency_keys": args.keyed,
        "backends": {},
    }
    for backend in args.backends.split(","):
        env = {**os.environ, "AGENTGRAD_BENCH_PG": args.pg_url, "AGENTGRAD_BENCH_REDIS": args.redis_url}
        out = subprocess.run(
            _child(backend, n) + keyed + (["--gc-scan-all"] if args.gc_scan_all else []),
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode:
            sys.exit(f"the {backend} run failed:\n{out.stderr[-3000:]}")
        report["backends"][backend] = json.loads(out.stdout)
    if args.reference_python:
        out = subprocess.run(
            [args.reference_python, str(Path(__file__).with_name("reference_store_workload.py")), str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
        reference = report["reference_agentlightning_memory"] = json.loads(out.stdout)
        report["times_the_reference"] = {
            backend: {
                phase: round(figures[phase]["ops_per_s"] / reference[phase]["ops_per_s"], 1)
                for phase in ("mixed_unbatched", "add_span_single", "add_spans_batch1000", "query_spans")
            }
            for backend, figures in report["backends"].items()
        }
    targets = {
        "sqlite_batched_span_inserts_per_s>=20000": report["backends"]
        .get("sqlite", {})
        .get("add_spans_batch1000", {})
        .get("spans_per_s", 0)
        >= 20000,
        "sqlite_mixed_unbatched_ops_per_s>=5000": report["backends"]
        .get("sqlite", {})
        .get("mixed_unbatched", {})
        .get("ops_per_s", 0)
        >= 5000,
        "memory_mixed_unbatched_ops_per_s>=50000": report["backends"]
        .get("memory", {})
        .get("mixed_unbatched", {})
        .get("ops_per_s", 0)
        >= 50000,
    }
    report["targets_met"] = targets
    print(json.dumps(report, indent=2))


def _child(backend: str, n: int) -> list[str]:
    return [sys.executable, __file__, "--child", backend, "--n", str(n)]


def count_instructions(backends: list[str], n: int, options: list[str]) -> dict[str, Any]:
    """Instructions per call of every phase, per backend (the workload run under callgrind)."""
    from callgrind import count_phases

    ops = {
        "enqueue": n,
        "dequeue_start": 2 * n,
        "dequeue_empty": n,
        "add_span_single": n * SPANS_PER_ROLLOUT,
        "update_succeeded": n,
        "query_spans": n,
        "add_spans_batch10": n * SPANS_PER_ROLLOUT,
        "add_spans_batch1000": n * SPANS_PER_ROLLOUT,
    }
    report: dict[str, Any] = {"n_rollouts": n, "unit": "instructions per call (spans: per span)", "backends": {}}
    for backend in backends:
        counts = count_phases(_child(backend, n) + options + ["--instructions"])
        figures = {phase: round(counts[phase] / ops[phase]) for phase in ops}
        figures["mixed_unbatched"] = round(sum(counts[p] for p in LIFECYCLE) / sum(ops[p] for p in LIFECYCLE))
        report["backends"][backend] = figures
    return report


if __name__ == "__main__":
    main()
