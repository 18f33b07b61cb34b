"""bench_http_store.py's one-client workload on the reference system's HTTP store (Agent Lightning).

Run by ``bench_http_store.py --reference-python PY`` under an interpreter that has
``agentlightning`` (see ``reference_store_workload.py``). The reference's server
(``LightningStoreServer`` over its ``InMemoryLightningStore``, uvicorn on 127.0.0.1) runs in a
child process, as ours does, and its own client (``LightningStoreClient``) makes the calls from
this one. Prints one JSON object with ``bench_http_store.py``'s operation names: calls/s, items/s
and latency per operation with one client. Spans are built before the timed calls, with their
``sequence_id`` already set (the reference expects the caller to fetch it first: a call per span
not counted here, which favours the reference).
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from typing import Any

SERVER = (
    "import asyncio, logging, sys\n"
    "logging.disable(logging.WARNING)\n"
    "from agentlightning.store.client_server import LightningStoreServer\n"
    "from agentlightning.store.memory import InMemoryLightningStore\n"
    "server = LightningStoreServer(InMemoryLightningStore(thread_safe=True), host='127.0.0.1', "
    "port=int(sys.argv[1]), launch_mode='asyncio')\n"
    "asyncio.run(server.run_forever())\n"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


def _span(rollout_id: str, attempt_id: str, index: int, sequence_id: int) -> Any:
    from agentlightning.types import OtelResource, Span, TraceStatus

    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        sequence_id=sequence_id,
        trace_id=f"{index:032x}",
        span_id=f"{sequence_id:08x}{index:08x}",
        parent_id=None,
        name="step",
        status=TraceStatus(status_code="UNSET"),
        attributes={"agentgrad.llm.prompt_token_ids": list(range(64)), "note": "x" * 100},
        events=[],
        links=[],
        start_time=time.time(),
        end_time=None,
        context=None,
        parent=None,
        resource=OtelResource(attributes={}, schema_url=""),
    )


async def run(url: str, ops: int, batch: int) -> dict[str, Any]:
    from agentlightning.store.client_server import LightningStoreClient

    client = LightningStoreClient(url)
    out: dict[str, Any] = {}

    async def timed(name: str, count: int, op: Any, calls_per_op: int = 1, items_per_op: int = 1) -> list[Any]:
        latencies, results = [], []
        started = time.perf_counter()
        for i in range(count):
            t = time.perf_counter()
            results.append(await op(i))
            latencies.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - started
        out[name] = {
            "ops_per_s": round(count * calls_per_op / elapsed),
            "items_per_s": round(count * items_per_op / elapsed),
            "p50_ms": _pct(latencies, 0.5),
            "p99_ms": _pct(latencies, 0.99),
        }
        return results

    await timed("enqueue", ops, lambda i: client.enqueue_rollout(input={"i": i}))

    async def dequeue_start(i: int) -> tuple[str, str]:
        claimed = await client.dequeue_rollout(worker_id="bench")
        await client.update_attempt(claimed.rollout_id, claimed.attempt.attempt_id, status="running")
        return claimed.rollout_id, claimed.attempt.attempt_id

    pairs = await timed("dequeue+start", ops, dequeue_start, calls_per_op=2)
    singles = [_span(*pairs[i], 0, 1) for i in range(ops)]
    await timed("add_span", ops, lambda i: client.add_span(singles[i]))
    batches = [[_span(*pairs[i], k, 2 + k) for k in range(batch)] for i in range(max(1, ops // 20))]
    await timed(
        f"add_spans_batch{batch}", len(batches), lambda i: client.add_many_spans(batches[i]), items_per_op=batch
    )
    await timed("update_attempt", ops, lambda i: client.update_attempt(*pairs[i], status="succeeded"))
    await client.close()
    return out


def main() -> None:
    import logging

    logging.disable(logging.WARNING)
    ops, batch = int(sys.argv[1]), int(sys.argv[2])
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the reference store server did not start") from None
                time.sleep(0.2)
        import agentlightning

        results = asyncio.run(run(f"http://127.0.0.1:{port}", ops, batch))
        results["version"] = getattr(agentlightning, "__version__", "unknown")
        print(json.dumps(results))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
