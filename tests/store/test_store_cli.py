"""``agentgrad store serve`` as a real process: logs its URL, serves, stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")

SRC = Path(__file__).resolve().parents[2] / "src"
#: The real entry point (``agentgrad …``): its logging set-up decides whether the URL line shows.
HARNESS = "import sys\nfrom agentgrad.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def _start(*argv: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HARNESS, "store", "serve", "--port", "0", *argv],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})},
    )
    deadline = time.monotonic() + 30
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail("store serve did not report its URL:\n" + "".join(seen))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_sqlite_with_token_then_stop_on_signal(tmp_path, sig):
    db = tmp_path / "store.db"
    proc, url = _start("--backend", f"sqlite:///{db}", env={"AGENTGRAD_STORE_TOKEN": "tok"})
    try:
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/v1/resources").status_code == 401
        from agentgrad.store.client import StoreClient

        client = StoreClient(url, token="tok")
        rid = client.enqueue_rollout({"q": 1}).rollout_id
        client.close()
        proc.send_signal(sig)
        assert proc.wait(timeout=20) == 0
        log = proc.stderr.read()
        assert "Traceback" not in log
    finally:
        if proc.poll() is None:
            proc.kill()
    from agentgrad.store.sqlite import SqliteStore

    with SqliteStore(db, watchdog_interval=None) as store:  # closed cleanly: the data is there
        assert store.get_rollout(rid).input == {"q": 1}


def test_help_lists_the_options():
    out = subprocess.run(
        [sys.executable, "-c", HARNESS, "store", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=True,
    ).stdout
    for option in ("--backend", "--host", "--port", "--token", "--max-body-mb"):
        assert option in out
