"""Memory and responsiveness of the store service over one very long rollout (issue 22, finding 8).

Starts ``agentgrad store serve`` over a fresh SQLite file in its own process, writes ``--spans``
spans (default 1,000,000) into one attempt through ``StoreClient`` in batches, then reads them back
by every read path, each paged:

* ``client_pages``: ``StoreClient.query_spans(after_sequence_id=…, limit=MAX_SPAN_PAGE)`` in a loop;
* ``http_default_pages``: ``GET /v1/spans`` following ``next_after_sequence_id`` (default page);
* ``latest_llm_call_check``: the runner's check for a captured LLM call (``name=`` filter,
  ``limit=1``), which finds none here and so walks every span of the rollout;
* ``dashboard_first_page`` and ``dashboard_next_page``: the rollout's dashboard page;
* ``client_whole`` (only with ``--whole``): ``query_spans()`` with no limit, which the client
  reads page by page and keeps entirely (the client's memory then holds every span).

For every phase it reports the wall time, the peak resident memory of the server and of this
client *during that phase* (Linux ``VmHWM``, reset before each phase through
``/proc/<pid>/clear_refs``), and, while reads run, the latency of heartbeats sent by another
thread every 20 ms: a read that held the service up would show here as a long heartbeat.

    python bench/bench_memory.py [--spans 1000000] [--batch 2000] [--attribute-bytes 200] [--whole]

Prints one JSON object. Never a timed assertion: figures, to compare runs on the same machine.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)

import httpx
from serving import start_listening  # bench/ is on sys.path

from agentgrad import semconv
from agentgrad.store import wire
from agentgrad.store.client import StoreClient
from agentgrad.types import Span


def start_server(db: Path) -> tuple[subprocess.Popen[str], str]:
    command = [sys.executable, "-m", "agentgrad", "store", "serve", "--backend", f"sqlite:///{db}", "--port", "0"]
    return start_listening([*command, "--log-level", "info"], env={**os.environ, "PYTHONPATH": SRC})


def peak_mb(pid: int | str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM")


def reset_peak(pid: int | str) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


class Heartbeats:
    """Heartbeats every ``interval`` seconds from a thread of its own, with their latencies."""

    def __init__(self, url: str, rollout_id: str, attempt_id: str, interval: float = 0.02) -> None:
        self.client = StoreClient(url, retries=0, timeout=120)
        self.ids, self.interval = (rollout_id, attempt_id), interval
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            started = time.perf_counter()
            self.client.heartbeat(*self.ids)
            self.latencies.append(time.perf_counter() - started)

    def __enter__(self) -> Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()

    def summary(self) -> dict[str, Any]:
        if not self.latencies:
            return {"heartbeats": 0}
        ordered = sorted(self.latencies)
        return {
            "heartbeats": len(ordered),
            "heartbeat_p50_ms": round(statistics.median(ordered) * 1000, 2),
            "heartbeat_p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 2),
            "heartbeat_max_ms": round(ordered[-1] * 1000, 2),
        }


@contextmanager
def phase(results: dict[str, Any], name: str, server_pid: int) -> Iterator[dict[str, Any]]:
    reset_peak(server_pid)
    reset_peak("self")
    record: dict[str, Any] = {}
    started = time.perf_counter()
    yield record
    record["seconds"] = round(time.perf_counter() - started, 3)
    record["server_peak_rss_mb"] = peak_mb(server_pid)
    record["client_peak_rss_mb"] = peak_mb("self")
    results[name] = record


def write_spans(client: StoreClient, rollout_id: str, attempt_id: str, total: int, batch: int, text: str) -> None:
    for first in range(0, total, batch):
        client.add_spans(
            [
                Span(
                    rollout_id=rollout_id,
                    attempt_id=attempt_id,
                    name="agent.step",
                    attributes={"index": i, "text": text},
                )
                for i in range(first, min(total, first + batch))
            ]
        )


def read_pages(read: Callable[[int], tuple[int, int | None]]) -> tuple[int, int]:
    """Follow pages from the start: ``read(after)`` → (spans on the page, next after or None)."""
    spans = pages = 0
    after: int | None = 0
    while after is not None:
        count, after = read(after)
        spans, pages = spans + count, pages + 1
    return spans, pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=1_000_000, help="spans written into the one rollout")
    parser.add_argument("--batch", type=int, default=2000, help="spans per add_spans call")
    parser.add_argument("--attribute-bytes", type=int, default=200, help="text carried by each span")
    parser.add_argument("--whole", action="store_true", help="also read every span into the client at once")
    args = parser.parse_args()

    results: dict[str, Any] = {
        "spans": args.spans,
        "batch": args.batch,
        "attribute_bytes": args.attribute_bytes,
        "max_span_page": wire.MAX_SPAN_PAGE,
        "default_span_page": wire.DEFAULT_SPAN_PAGE,
    }
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.db"
        proc, url = start_server(db)
        client = StoreClient(url, timeout=600)
        http = httpx.Client(base_url=url, timeout=600)
        try:
            client.enqueue_rollout({"task": "long"}, rollout_id="long")
            attempt_id = client.dequeue_rollout(worker_id="bench").attempt.attempt_id
            client.update_attempt("long", attempt_id, "running")

            with phase(results, "write", proc.pid) as record:
                write_spans(client, "long", attempt_id, args.spans, args.batch, "x" * args.attribute_bytes)
            record["spans_per_s"] = round(args.spans / record["seconds"])
            results["db_mb"] = round(sum(p.stat().st_size for p in Path(tmp).iterdir()) / 2**20, 1)

            def client_page(after: int) -> tuple[int, int | None]:
                page = client.query_spans("long", attempt_id, after_sequence_id=after, limit=wire.MAX_SPAN_PAGE)
                return len(page), page[-1].sequence_id if len(page) == wire.MAX_SPAN_PAGE else None

            def http_page(after: int) -> tuple[int, int | None]:
                page = http.get("/v1/spans", params={"rollout_id": "long", "after_sequence_id": after}).json()
                return len(page["spans"]), page["next_after_sequence_id"]

            for name, read in (("client_pages", client_page), ("http_default_pages", http_page)):
                with Heartbeats(url, "long", attempt_id) as beats, phase(results, name, proc.pid) as record:
                    record["spans_read"], record["pages"] = read_pages(read)
                record.update(beats.summary())

            with Heartbeats(url, "long", attempt_id) as beats, phase(results, "latest_llm_call_check", proc.pid) as rec:
                rec["found"] = len(client.query_spans("long", "latest", name=semconv.SPAN_LLM_CALL, limit=1))
            rec.update(beats.summary())

            with phase(results, "dashboard_first_page", proc.pid) as record:
                response = http.get("/dashboard/rollouts/long")
                record["status"], record["html_kb"] = response.status_code, round(len(response.content) / 1024)
            after = re.search(r"after=(\d+)", response.text)
            with phase(results, "dashboard_next_page", proc.pid) as record:
                response = http.get(
                    f"/dashboard/rollouts/long?attempt={attempt_id}&after={after.group(1) if after else 0}"
                )
                record["status"], record["html_kb"] = response.status_code, round(len(response.content) / 1024)

            if args.whole:
                with Heartbeats(url, "long", attempt_id) as beats, phase(results, "client_whole", proc.pid) as record:
                    record["spans_read"] = len(client.query_spans("long"))
                record.update(beats.summary())
        finally:
            http.close()
            client.close()
            proc.terminate()
            proc.wait(30)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
