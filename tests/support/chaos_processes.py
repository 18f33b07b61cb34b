"""Real processes for the chaos suite: the store service and runners, each started by its CLI on
127.0.0.1 and killed by its PID, as an operator's crash would kill them.

``StoreService`` keeps its port across restarts (runners keep the URL they were given);
``RunnerProcess`` is one ``agentgrad runner``. Both write their output to a log file the test
reads afterwards (a pipe nobody drains would block them).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from agentgrad.http.transport import request_json

SRC = Path(__file__).resolve().parents[2] / "src"
SUPPORT = Path(__file__).resolve().parent


def child_env() -> dict[str, str]:
    """The environment of a child: this checkout's package and the test agents on its path."""
    path = os.pathsep.join(p for p in (str(SRC), str(SUPPORT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Process:
    """A CLI command in a process of its own, its output in ``log``."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, *args: str) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentgrad", *args], stdout=out, stderr=subprocess.STDOUT, env=child_env()
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> int:
        """SIGKILL, by PID; returns the exit status (``-SIGKILL``)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, by PID, and wait; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class StoreService(_Process):
    """``agentgrad store serve`` over an SQLite file, on one port for all its lives."""

    def __init__(self, db: Path, log: Path, port: int | None = None) -> None:
        super().__init__(log)
        self.db = db
        self.port = port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> StoreService:
        """Start it and return once ``/health`` answers."""
        self._spawn(
            "store",
            "serve",
            "--backend",
            f"sqlite:///{self.db}",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"the store service exited with {self.proc.returncode}:\n{self.text()[-3000:]}")
            try:
                if request_json("GET", self.url + "/health", timeout=2).status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"the store service did not answer within {timeout} s:\n{self.text()[-3000:]}")


class RunnerProcess(_Process):
    """``agentgrad runner AGENT --store URL`` under a worker id of its own."""

    def __init__(self, agent: str, store_url: str, worker_id: str, log_dir: Path, concurrency: int = 1) -> None:
        super().__init__(log_dir / f"{worker_id}.log")
        self.worker_id = worker_id
        self._spawn("runner", agent, "--store", store_url, "--worker-id", worker_id, "--concurrency", str(concurrency))
