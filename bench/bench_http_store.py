"""HTTP store throughput and latency: StoreClient → store service (separate process) → SQLite.

Prints one JSON object: ops/s and p50/p99 latency (ms) per operation with 1 and 4 clients,
batched span throughput, and claim latency/double claims with 4 concurrent claimers.

    python bench/bench_http_store.py [--backend sqlite|memory] [--ops 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agentgrad.store.client import StoreClient  # noqa: E402
from agentgrad.types import Span  # noqa: E402

SERVER = (
    "import logging, sys\n"
    "logging.basicConfig(level='INFO')\n"
    "from agentgrad.store.server import serve\n"
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
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, store_url], stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
            return proc, found.group(1)
    raise RuntimeError("server did not start")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def run(clients: list[StoreClient], ops_per_client: int, op: Callable[[StoreClient, int], int]) -> dict:
    """Run ``op`` ops_per_client times on every client concurrently; op returns items handled."""
    latencies: list[list[float]] = [[] for _ in clients]
    items = [0] * len(clients)

    def worker(k: int) -> None:
        for i in range(ops_per_client):
            t = time.perf_counter()
            items[k] += op(clients[k], i)
            latencies[k].append(time.perf_counter() - t)

    elapsed = run_threads(worker, len(clients))
    flat = [x for lat in latencies for x in lat]
    return {"ops_per_s": round(len(flat) / elapsed), "items_per_s": round(sum(items) / elapsed),
            "p50_ms": round(pct(flat, 0.5), 3), "p99_ms": round(pct(flat, 0.99), 3)}


def bench(url: str, n_clients: int, ops: int, batch: int) -> dict:
    clients = [StoreClient(url) for _ in range(n_clients)]
    per = ops // n_clients
    out: dict[str, dict] = {}
    out["enqueue"] = run(clients, per, lambda c, i: len([c.enqueue_rollout({"i": i})]))
    claims: list[list] = [[] for _ in clients]
    index = {id(c): k for k, c in enumerate(clients)}

    def dequeue_start(c: StoreClient, i: int) -> int:
        got = c.dequeue_rollout(worker_id="bench")
        c.update_attempt(got.rollout.rollout_id, got.attempt.attempt_id, "running")
        claims[index[id(c)]].append(got)
        return 1

    out["dequeue+start"] = run(clients, per, dequeue_start)
    out["dequeue+start"]["ops_per_s"] *= 2  # two calls per iteration
    out["add_span"] = run(clients, per, lambda c, i: len(c.add_spans([_span(claims[index[id(c)]][i % len(claims[0])])])))
    out[f"add_spans_batch{batch}"] = run(
        clients, max(1, per // 20), lambda c, i: len(c.add_spans([_span(claims[index[id(c)]][i]) for _ in range(batch)])))
    out["update_attempt"] = run(clients, per, lambda c, i: (c.update_attempt(
        claims[index[id(c)]][i].rollout.rollout_id, claims[index[id(c)]][i].attempt.attempt_id, "succeeded"), 1)[1])
    out["enqueue_batch100"] = run(clients, max(1, per // 20),
                                  lambda c, i: len(c.enqueue_rollouts([{"input": j} for j in range(100)])))
    for c in clients:
        c.close()
    return out


def _span(claim) -> Span:
    return Span(rollout_id=claim.rollout.rollout_id, attempt_id=claim.attempt.attempt_id, name="step",
                attributes={"agentgrad.llm.prompt_token_ids": list(range(64)), "note": "x" * 100})


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
    return {"claimers": claimers, "claimed": len(everything), "double_claims": len(everything) - len(set(everything)),
            "claims_per_s": round(len(everything) / elapsed), "p50_ms": round(pct(latencies, 0.5), 3),
            "p99_ms": round(pct(latencies, 0.99), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "memory"])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store_url = f"sqlite:///{tmp}/bench.db" if args.backend == "sqlite" else "memory"
        results: dict = {"backend": args.backend, "cpus": os.cpu_count()}
        for n_clients in (1, 4):
            proc, url = start_server(store_url if args.backend == "memory" else f"sqlite:///{tmp}/bench{n_clients}.db")
            try:
                results[f"clients_{n_clients}"] = bench(url, n_clients, args.ops, args.batch)
                if n_clients == 4:
                    results["claim_race"] = claim_race(url)
            finally:
                proc.terminate()
                proc.wait(10)
        unbatched = [v["ops_per_s"] for k, v in results["clients_1"].items() if "batch" not in k]
        results["summary"] = {"unbatched_ops_per_s_1_client_median": statistics.median(unbatched),
                              "batched_spans_per_s_1_client": results["clients_1"][f"add_spans_batch{args.batch}"]["items_per_s"]}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
