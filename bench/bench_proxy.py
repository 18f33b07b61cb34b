"""Latency the capture proxy adds to an LLM call, versus calling the same upstream directly.

Prints JSON. Upstreams:

* ``stub``: :class:`agentgrad.testing.stub.StubUpstream`, a *fast local upstream stand-in* (scripted
  answers, no model), so the difference is the proxy's own overhead;
* ``engine``: the real local engine serving the tiny model (skipped with ``--no-engine``), where
  the overhead is compared with real generation time.

Every server (upstream, proxy) runs in its own process, as in production, so the client's GIL does
not slow them. Direct and proxied calls alternate, so drift affects both alike. Each proxy records
into its own SQLite store. Rows:

* ``proxy_unattributed``: forwarding alone (a call without rollout is not recorded);
* ``proxy_recording``: the default ``record_mode="async"`` (span written behind the answer by a
  batching background writer — with the CLI's ``--write-linger-ms`` default; the runner's
  per-attempt flush is not on the call's path);
* ``proxy_recording_sync``: ``record_mode="sync"`` (span committed before the answer ends);
* ``baseline_*`` (with ``--baseline-src DIR``): the same three for another checkout's ``src`` (e.g. the
  code before a change), measured in the same run so that machine load affects all rows alike.

``--repeat K`` runs the whole comparison K times (fresh processes) and reports each run.

Reference point: the reference system's proxy adds 2.7 ms per call; our target is ≤ 0.5 ms p50.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}

from agentgrad.proxy.hooks import rollout_endpoint  # noqa: E402
from agentgrad.store import open_store  # noqa: E402

#: Asks for what the proxy asks for anyway, so the upstream does the same work on both paths.
BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "What is 2 + 3?"}],
    "max_tokens": 8,
    "temperature": 0,
    "return_token_ids": True,
    "logprobs": True,
}

_SERVE_STUB = """
import signal, sys, threading
from agentgrad.testing.stub import StubUpstream
stub = StubUpstream(["The answer is 5."], chunk_chars=2)
print(stub.start(), flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
stub.stop()
"""
_SERVE_ENGINE = """
import signal
from agentgrad.inference import ModelServer
from agentgrad.demo.tiny import ensure_tiny_model
server = ModelServer(str(ensure_tiny_model()))
print(server.start(), flush=True)
signal.sigwait([signal.SIGTERM, signal.SIGINT])
server.stop()
"""


@contextmanager
def _process(args: list[str], url_of: Callable[[str], str], src: Path | None = None) -> Iterator[str]:
    """Start a server process; its first stdout line names its URL."""
    env = ENV if src is None else {**ENV, "PYTHONPATH": str(src)}
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"{args[:4]} exited before printing its URL")
        yield url_of(line.strip())
    finally:
        process.terminate()
        process.wait(30)


def _snippet(code: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import signal; signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGINT])\n" + code,
    ]


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3),
    }


def _call(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    response = client.post(url + "/chat/completions", json=BODY)
    response.raise_for_status()
    return time.perf_counter() - start


def _first_token(client: httpx.Client, url: str) -> float:
    start = time.perf_counter()
    with client.stream("POST", url + "/chat/completions", json={**BODY, "stream": True}) as response:
        response.raise_for_status()
        elapsed = None
        for piece in response.iter_raw():
            if elapsed is None and b"data:" in piece:
                elapsed = time.perf_counter() - start
    return elapsed


def measure(direct: str, proxied: dict[str, str], n: int, warmup: int) -> dict[str, object]:
    """Alternate direct and proxied calls; report latencies and the added p50/p99."""
    result: dict[str, object] = {"calls": n}
    with httpx.Client(timeout=120) as client:
        for kind, probe in (("non_streamed", _call), ("streamed_ttft", _first_token)):
            urls = {"direct": direct, **proxied}
            samples: dict[str, list[float]] = {name: [] for name in urls}
            for index in range(warmup + n):
                for name, url in urls.items():
                    elapsed = probe(client, url)
                    if index >= warmup:
                        samples[name].append(elapsed)
            stats = {name: _percentiles(values) for name, values in samples.items()}
            for name in proxied:
                stats[f"added_by_{name}"] = {
                    "p50_ms": round(stats[name]["p50_ms"] - stats["direct"]["p50_ms"], 3),
                    "p99_ms": round(stats[name]["p99_ms"] - stats["direct"]["p99_ms"], 3),
                }
            result[kind] = stats
    return result


def _wait_healthy(proxy_url: str, timeout: float = 30.0) -> None:
    root = proxy_url.rstrip("/").removesuffix("/v1")
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(root + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def _attempt_url(proxy_url: str, db: str) -> str:
    with open_store(f"sqlite://{db}", watchdog=False) as store:
        store.enqueue_rollout({"bench": True})
        claimed = store.dequeue_rollout("bench")
    return rollout_endpoint(proxy_url, claimed.rollout.rollout_id, claimed.attempt.attempt_id)


def bench(upstream_code: str, n: int, warmup: int, baseline_src: Path | None = None) -> dict[str, object]:
    variants: list[tuple[str, Path | None, list[str]]] = [
        ("proxy", None, []),
        ("proxy_sync", None, ["--record-mode", "sync"]),
    ]
    if baseline_src is not None:
        variants += [("baseline", baseline_src, []), ("baseline_sync", baseline_src, ["--record-mode", "sync"])]
    with tempfile.TemporaryDirectory() as tmp, _process(_snippet(upstream_code), str) as upstream, ExitStack() as stack:
        proxied: dict[str, str] = {}
        for name, src, extra in variants:
            db = str(Path(tmp) / f"{name}.db")
            open_store(f"sqlite://{db}", watchdog=False).close()  # created before the proxy opens it
            args = [
                sys.executable,
                "-m",
                "agentgrad",
                "proxy",
                "--store",
                f"sqlite://{db}",
                "--upstream",
                upstream,
                "--port",
                "0",
                *extra,
            ]
            proxy = stack.enter_context(_process(args, lambda line: line.split()[3], src))
            _wait_healthy(proxy)  # the CLI prints once bound, a moment before it accepts
            if name.endswith("_sync"):
                proxied[name.removesuffix("_sync") + "_recording_sync"] = _attempt_url(proxy, db)
                continue
            proxied[f"{name}_recording"] = _attempt_url(proxy, db)
            proxied[f"{name}_unattributed"] = proxy
        return measure(upstream, proxied, n, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=300, help="calls per variant against the stub")
    parser.add_argument("--engine-n", type=int, default=40, help="calls per variant against the engine")
    parser.add_argument("--no-engine", action="store_true", help="skip the real-engine run")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="also measure the proxy of this src directory (e.g. a copy from before a change)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="repeat the stub comparison this many times")
    parser.add_argument("--summary", action="store_true", help="print only the added p50/p99 per run")
    args = parser.parse_args()
    runs = [bench(_SERVE_STUB, args.n, warmup=30, baseline_src=args.baseline_src) for _ in range(args.repeat)]
    if args.summary:
        runs = [
            {
                kind: {k: v for k, v in stats.items() if k.startswith("added_by_")}  # type: ignore[union-attr]
                for kind, stats in run.items()
                if kind != "calls"
            }
            for run in runs
        ]
    report: dict[str, object] = {
        "reference_proxy_added_ms": 2.7,
        "target_added_p50_ms": 0.5,
        "cpu_count": os.cpu_count(),
        "stub_upstream (fast local stand-in)": runs[0] if len(runs) == 1 else runs,
    }
    if not args.no_engine:
        report["engine_tiny_model"] = bench(_SERVE_ENGINE, args.engine_n, warmup=5, baseline_src=args.baseline_src)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
