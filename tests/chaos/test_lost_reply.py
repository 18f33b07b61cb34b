"""Chaos: the reply to a committed write is lost, the store service is SIGKILLed and restarted,
and the client's retry (same Idempotency-Key) gets the first answer, the write done once.

A relay sits between a ``StoreClient`` and a real ``agentgrad store serve`` process over an
SQLite file. For the write under test it forwards the request, reads the service's whole answer
(so the write is committed), throws the answer away, SIGKILLs the service, starts a new one on
the same file and only then closes the client's connection without a byte. The client retries
with the key it sent; the new process knows nothing but the file. Every ``replayable`` write of
``store/service/routes.py`` is covered. (Issue 22, finding 3: before, enqueue and add_resources
raised AlreadyExistsError, cancel InvalidTransitionError, add_metrics stored the record twice and
dequeue claimed a second rollout.)
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")

from agentgrad.store.client import StoreClient  # noqa: E402
from agentgrad.store.protocol import RolloutFilter  # noqa: E402
from agentgrad.types import MetricRecord  # noqa: E402

pytestmark = pytest.mark.chaos

SRC = Path(__file__).resolve().parents[2] / "src"
HARNESS = "import sys\nfrom agentgrad.cli import main\nsys.exit(main(sys.argv[1:]))\n"


class Service:
    """``agentgrad store serve`` over one SQLite file, in a process of its own."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HARNESS, "store", "serve", "--port", "0", "--backend", f"sqlite:///{self.db}"],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(SRC)},
        )
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            seen.append(line)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep the pipe drained
                return
            if not line and self.proc.poll() is not None:
                break
        self.kill()
        pytest.fail("store serve did not report its URL:\n" + "".join(seen))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class Dropped:
    """The answer the relay threw away."""

    status: int
    body: bytes


class Relay(socketserver.ThreadingTCPServer):
    """An HTTP/1.1 relay to ``upstream()``'s port. After :meth:`drop_next` names a path, the next
    request to it is forwarded and answered by the service, then ``on_drop`` runs and the client's
    connection is closed without an answer."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: Callable[[], int]) -> None:
        super().__init__(("127.0.0.1", 0), _RelayHandler)
        self.upstream = upstream
        self.drop_path: str | None = None
        self.on_drop: Callable[[], None] = lambda: None
        self.dropped: list[Dropped] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def drop_next(self, path: str, on_drop: Callable[[], None]) -> None:
        self.drop_path, self.on_drop = path, on_drop

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _RelayHandler(socketserver.StreamRequestHandler):
    server: Relay

    def handle(self) -> None:
        while True:
            request_line = self.rfile.readline()
            if not request_line.strip():
                return
            method, target, _ = request_line.decode("latin-1").split(" ", 2)
            headers: list[tuple[str, str]] = []
            while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers.append((name.strip(), value.strip()))
            length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
            body = self.rfile.read(length) if length else b""
            try:
                status, reason, reply_headers, reply = self._forward(method, target, headers, body)
            except OSError:
                return  # the service is down: close, as a dead service would
            relay = self.server
            if relay.drop_path is not None and target.split("?")[0] == relay.drop_path:
                relay.drop_path = None
                relay.dropped.append(Dropped(status, reply))
                relay.on_drop()
                return  # closes the connection: the answer is lost
            head = [f"HTTP/1.1 {status} {reason}"]
            head += [f"{k}: {v}" for k, v in reply_headers if k.lower() not in ("content-length", "transfer-encoding")]
            if status not in (204, 304):
                head.append(f"content-length: {len(reply)}")
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + reply)
            self.wfile.flush()

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream(), timeout=60)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                conn.putheader(name, value)
            conn.endheaders(body or None)
            response = conn.getresponse()
            return response.status, response.reason, response.getheaders(), response.read()
        finally:
            conn.close()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[Service, Relay, StoreClient]]:
    service = Service(tmp_path / "store.db")
    service.start()
    relay = Relay(lambda: service.port)
    client = StoreClient(relay.url, retries=5, backoff=0.05, timeout=60)
    try:
        yield service, relay, client
    finally:
        client.close()
        relay.close()
        service.kill()


def _restart(service: Service) -> Callable[[], None]:
    def restart() -> None:
        service.kill()
        service.start()

    return restart


def _dumped(answer: Any) -> Any:
    return json.loads(answer.model_dump_json())


@dataclass(frozen=True)
class Case:
    path: str
    prepare: Callable[[StoreClient], Any]
    write: Callable[[StoreClient, Any], Any]
    #: The client's answer as the service's JSON body (None for 204).
    as_body: Callable[[Any], Any]
    #: What the write left in the store, read after the retry (one write's worth).
    effect: Callable[[StoreClient, Any], Any]
    expected: Any


def _queued_two(client: StoreClient) -> list[str]:
    return [r.rollout_id for r in client.enqueue_rollouts([{"input": 1}, {"input": 2}])]


CASES = {
    "enqueue": Case(
        "/v1/rollouts/enqueue",
        lambda c: None,
        lambda c, _: c.enqueue_rollouts([{"input": {"task": 1}}, {"input": {"task": 2}}]),
        lambda answer: {"rollouts": [_dumped(r) for r in answer]},
        lambda c, _: c.count_rollouts(),
        2,
    ),
    "dequeue": Case(
        "/v1/rollouts/dequeue",
        _queued_two,
        lambda c, _: c.dequeue_rollouts(1, worker_id="w-1"),
        lambda answer: {"claimed": [_dumped(a) for a in answer]},
        lambda c, ids: ([len(c.get_attempts(rid)) for rid in ids], c.count_rollouts(RolloutFilter(status=["queuing"]))),
        ([1, 0], 1),
    ),
    "cancel": Case(
        "/v1/rollouts/cancel",
        _queued_two,
        lambda c, ids: c.cancel_rollout(ids[0]),
        _dumped,
        lambda c, ids: [c.get_rollout(rid).status for rid in ids],
        ["cancelled", "queuing"],
    ),
    "add_resources": Case(
        "/v1/resources",
        lambda c: None,
        lambda c, _: c.add_resources({"temperature": 0.5}),
        _dumped,
        lambda c, _: [r.version for r in c.query_resources()],
        [1],
    ),
    "add_metrics": Case(
        "/v1/metrics",
        lambda c: None,
        lambda c, _: c.add_metrics([MetricRecord(run_id="r", step=1, values={"loss": 0.5})]),
        lambda answer: answer,
        lambda c, _: len(c.query_metrics("r")),
        1,
    ),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_retry_after_a_lost_reply_and_a_restart_gets_the_first_answer(rig, kind):
    service, relay, client = rig
    case = CASES[kind]
    stage = case.prepare(client)
    first_pid = service.proc.pid
    relay.drop_next(case.path, _restart(service))
    answer = case.write(client, stage)
    assert service.proc.pid != first_pid, "the service was not restarted"
    (dropped,) = relay.dropped
    assert dropped.status in (200, 204), dropped.body
    assert case.as_body(answer) == (json.loads(dropped.body) if dropped.body else None), (
        "the retry's answer is not the answer that was lost"
    )
    assert case.effect(client, stage) == case.expected, "the write was done twice (or not at all)"


def test_the_relay_really_drops_the_reply(rig):
    """The rig's own check: without retries the caller sees the lost answer as an error."""
    _, relay, client = rig
    once = StoreClient(relay.url, retries=0, timeout=60)
    relay.drop_next("/v1/resources", lambda: None)
    with pytest.raises(ConnectionError):
        once.add_resources({"t": 1})
    once.close()
    assert len(relay.dropped) == 1
    assert [r.items["t"].value for r in client.query_resources()] == [1], "the write was committed"
