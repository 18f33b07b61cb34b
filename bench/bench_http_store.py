"""HTTP store throughput and latency: StoreClient → store service (separate process) → SQLite.

Prints one JSON object: calls/s, p50/p99 latency (ms) and CPU time per call (server and client)
per operation with 1 and 4 clients, batched span throughput, and claim latency/double claims with
4 concurrent claimers. Spans are built before the timed calls, and each operation starts with the
harness's objects frozen out of the garbage collector's sweeps, as in ``bench_store.py`` (the
client's full collections over them were most of the batched calls' p99).

    python bench/bench_http_store.py [--backend sqlite|memory] [--ops 2000]
    python bench/bench_http_store.py --reference-python /tmp/agl/bin/python   # + Agent Lightning

``--reference-python PY`` also runs the one-client workload against the reference system's HTTP
store (``reference_http_workload.py``, under an interpreter that has ``agentlightning``; its
server keeps an in-memory store) in the same run, and reports our one-client figures as multiples
of its own.

The code measured is this checkout's ``src``, or the first PYTHONPATH entry when one is set (to
compare a baseline copy with the working tree back to back: machine load varies minute to minute).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

SRC = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)

from serving import cpu_seconds, start_listening  # noqa: E402 (bench/ is on sys.path)

from agentgrad.store.client import StoreClient  # noqa: E402
from agentgrad.types import Span  # noqa: E402

SERVER = (
    "import logging, sys\n"
    "logging.basicConfig(level='INFO')\n"
    "from agentgrad.store.service.server import serve\n"
    "serve(sys.argv[1], '127.0.0.1', 0, log_level='warning', store_options={'watchdog_interval': None})\n"
)


def run_threads(worker, n: int) -> float:
    """Run ``worker(k)`` for k in 0..n-1 on n threads at once; returns the wall time."""
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def start_server(store_url: str) -> tuple[subprocess.Popen, str]:
    return start_listening([sys.executable, "-c", SERVER, store_url], env={**os.environ, "PYTHONPATH": SRC})


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(
    clients: list[StoreClient],
    ops_per_client: int,
    op: Callable[[StoreClient, int], int],
    server_pid: int,
    calls_per_op: int = 1,
) -> dict:
    """Run ``op`` ops_per_client times on every client concurrently; op returns items handled and
    makes ``calls_per_op`` store calls. Reports calls/s, items/s, latency per op, and the server's
    and this process's CPU time per call."""
    latencies: list[list[float]] = [[] for _ in clients]
    items = [0] * len(clients)

    def worker(k: int) -> None:
        for i in range(ops_per_client):
            t = time.perf_counter()
            items[k] += op(clients[k], i)
            latencies[k].append(time.perf_counter() - t)

    # As in bench_store.py: the harness's own objects (claims, prebuilt spans) are frozen, so the
    # client's collections during the phase scan what the calls allocate, not them.
    gc.collect()
    gc.freeze()
    server_cpu, client_cpu = cpu_seconds(server_pid), time.process_time()
    elapsed = run_threads(worker, len(clients))
    server_cpu, client_cpu = cpu_seconds(server_pid) - server_cpu, time.process_time() - client_cpu
    flat = [x for lat in latencies for x in lat]
    calls = len(flat) * calls_per_op
    return {
        "ops_per_s": round(calls / elapsed),
        "items_per_s": round(sum(items) / elapsed),
        "p50_ms": round(pct(flat, 0.5), 3),
        "p99_ms": round(pct(flat, 0.99), 3),
        "server_cpu_us_per_call": round(server_cpu / calls * 1e6),
        "client_cpu_us_per_call": round(client_cpu / calls * 1e6),
    }


def bench(url: str, server_pid: int, n_clients: int, ops: int, batch: int) -> dict:
    clients = [StoreClient(url) for _ in range(n_clients)]
    per = ops // n_clients
    out: dict[str, dict] = {}
    out["enqueue"] = run(clients, per, lambda c, i: len([c.enqueue_rollout({"i": i})]), server_pid)
    claims: list[list] = [[] for _ in clients]
    index = {id(c): k for k, c in enumerate(clients)}

    def dequeue_start(c: StoreClient, i: int) -> int:
        got = c.dequeue_rollout(worker_id="bench")
        c.update_attempt(got.rollout.rollout_id, got.attempt.attempt_id, "running")
        claims[index[id(c)]].append(got)
        return 1

    out["dequeue+start"] = run(clients, per, dequeue_start, server_pid, calls_per_op=2)
    # Spans are built before the timed calls, as in bench_store.py: the runner's pydantic work of
    # making them is not the store's (it was ~40% of the client's time on a batch).
    singles = [[_span(claims[k][i % len(claims[0])]) for i in range(per)] for k in range(n_clients)]
    out["add_span"] = run(clients, per, lambda c, i: len(c.add_spans([singles[index[id(c)]][i]])), server_pid)
    batches = [
        [[_span(claims[k][i]) for _ in range(batch)] for i in range(max(1, per // 20))] for k in range(n_clients)
    ]
    out[f"add_spans_batch{batch}"] = run(
        clients, max(1, per // 20), lambda c, i: len(c.add_spans(batches[index[id(c)]][i])), server_pid
    )
    out["update_attempt"] = run(
        clients,
        per,
        lambda c, i: (
            c.update_attempt(
                claims[index[id(c)]][i].rollout.rollout_id, claims[index[id(c)]][i].attempt.attempt_id, "succeeded"
            ),
            1,
        )[1],
        server_pid,
    )
    out["enqueue_batch100"] = run(
        clients, max(1, per // 20), lambda c, i: len(c.enqueue_rollouts([{"input": j} for j in range(100)])), server_pid
    )
    for c in clients:
        c.close()
    return out


def _span(claim) -> Span:
    return Span(
        rollout_id=claim.rollout.rollout_id,
        attempt_id=claim.attempt.attempt_id,
        name="step",
        attributes={"agentgrad.llm.prompt_token_ids": list(range(64)), "note": "x" * 100},
    )


def claim_race(url: str, n: int = 2000, claimers: int = 4) -> dict:
    setup = StoreClient(url)
    for start in range(0, n, 500):
        setup.enqueue_rollouts([{"input": i} for i in range(start, min(n, start + 500))])
    clients = [StoreClient(url) for _ in range(claimers)]
    got: list[list[str]] = [[] for _ in clients]
    latencies: list[float] = []

    def worker(k: int) -> None:
        while True:
            t = time.perf_counter()
            claimed = clients[k].dequeue_rollout(worker_id=f"c{k}")
            latencies.append(time.perf_counter() - t)
            if claimed is None:
                return
            got[k].append(claimed.rollout.rollout_id)

    elapsed = run_threads(worker, claimers)
    everything = [r for g in got for r in g]
    return {
        "claimers": claimers,
        "claimed": len(everything),
        "double_claims": len(everything) - len(set(everything)),
        "claims_per_s": round(len(everything) / elapsed),
        "p50_ms": round(pct(latencies, 0.5), 3),
        "p99_ms": round(pct(latencies, 0.99), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "memory"])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument(
        "--reference-python", metavar="PY", help="an interpreter with agentlightning installed: run the reference too"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_url = f"sqlite:///{tmp}/bench.db" if args.backend == "sqlite" else "memory"
        results: dict = {"backend": args.backend, "cpus": os.cpu_count()}
        for n_clients in (1, 4):
            proc, url = start_server(store_url if args.backend == "memory" else f"sqlite:///{tmp}/bench{n_clients}.db")
            try:
                results[f"clients_{n_clients}"] = bench(url, proc.pid, n_clients, args.ops, args.batch)
                if n_clients == 4:
                    results["claim_race"] = claim_race(url)
            finally:
                proc.terminate()
                proc.wait(10)
        unbatched = [v for k, v in results["clients_1"].items() if "batch" not in k]
        results["summary"] = {
            "unbatched_ops_per_s_1_client_median": statistics.median(v["ops_per_s"] for v in unbatched),
            "unbatched_cpu_us_per_call_1_client_median": statistics.median(
                v["server_cpu_us_per_call"] + v["client_cpu_us_per_call"] for v in unbatched
            ),
            "batched_spans_per_s_1_client": results["clients_1"][f"add_spans_batch{args.batch}"]["items_per_s"],
        }
    if args.reference_python:
        out = subprocess.run(
            [
                args.reference_python,
                str(Path(__file__).with_name("reference_http_workload.py")),
                str(args.ops),
                str(args.batch),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        reference = results["reference_agentlightning_http_1_client"] = json.loads(out.stdout)
        results["times_the_reference_1_client"] = {
            op: round(figures["items_per_s"] / reference[op]["items_per_s"], 1)
            for op, figures in results["clients_1"].items()
            if op in reference
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
