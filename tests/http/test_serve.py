"""The serving helpers: uvicorn in a thread, and in the foreground until SIGTERM/SIGINT with exit 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

uvicorn = pytest.importorskip("uvicorn")

from agentgrad.http.serve import http_url, listening_socket, serve_in_thread  # noqa: E402
from agentgrad.http.transport import request_json  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")

SERVE_UNTIL_SIGNAL = """
import sys
import uvicorn
from agentgrad.http.serve import http_url, listening_socket, serve_until_signal

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})

sock = listening_socket("127.0.0.1", 0)
print(http_url("127.0.0.1", sock.getsockname()[1]), flush=True)
try:
    serve_until_signal(uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off")), sock)
finally:
    print("closed what it owns", flush=True)
"""


async def _ok(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_until_signal_returns_normally_and_the_process_exits_0(signum: int) -> None:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_UNTIL_SIGNAL], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = proc.stdout.readline().strip() if proc.stdout else ""
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
        deadline = time.monotonic() + 30
        while True:  # bound and listening; the app answers once uvicorn has started
            try:
                assert request_json("GET", url + "/", timeout=5).status == 200
                break
            except OSError:
                assert time.monotonic() < deadline, "the server never answered"
                time.sleep(0.05)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "closed what it owns" in stdout and "Traceback" not in stderr


def test_serve_in_thread_answers_at_once_and_stops_on_should_exit() -> None:
    sock = listening_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_ok, log_level="warning", lifespan="off"))
    thread = serve_in_thread(server, sock, name="agentgrad-test-server")
    try:
        assert thread.name == "agentgrad-test-server" and thread.daemon
        assert request_json("GET", http_url("127.0.0.1", port) + "/", timeout=5).body == b"ok"
    finally:
        server.should_exit = True
        thread.join(10)
    assert not thread.is_alive()


def test_serve_in_thread_gives_up_on_a_server_that_does_not_start_in_time() -> None:
    sock = listening_socket("127.0.0.1", 0)
    release = threading.Event()

    async def slow_to_start(scope, receive, send) -> None:
        await receive()  # lifespan.startup
        while not release.is_set():
            await asyncio.sleep(0.01)
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        await send({"type": "lifespan.shutdown.complete"})

    server = uvicorn.Server(uvicorn.Config(slow_to_start, log_level="critical", lifespan="on"))
    with pytest.raises(RuntimeError, match="agentgrad-slow failed to start on http://127.0.0.1:"):
        serve_in_thread(server, sock, name="agentgrad-slow", timeout=0.3)
    assert server.should_exit, "the server is told to exit once it gets there"
    release.set()
    thread = next(t for t in threading.enumerate() if t.name == "agentgrad-slow")
    thread.join(10)
    assert not thread.is_alive()
