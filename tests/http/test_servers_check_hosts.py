"""Every server the package starts answers only to its own names (issue 22, finding 7: a token-less
store service answered ``Host: attacker.example``, the shape of a DNS-rebinding attack): the store
service (with its dashboard), the dashboard alone, started from the CLI like a user would. The
proxy's and the model server's gates are tested in tests/proxy and tests/inference."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")

from agentgrad.http.guard import ALLOWED_HOSTS_ENV  # noqa: E402
from agentgrad.store.client import StoreClient  # noqa: E402
from agentgrad.store.memory import MemoryStore  # noqa: E402
from agentgrad.store.service.server import StoreServer  # noqa: E402

EVIL = {"Host": "attacker.example"}


def test_store_service_refuses_foreign_hosts_with_or_without_a_token(monkeypatch) -> None:
    monkeypatch.delenv(ALLOWED_HOSTS_ENV, raising=False)
    for token in (None, "t"):
        with StoreServer(
            MemoryStore(watchdog_interval=None), token=token, owns_store=True, allowed_hosts=["store.lan"]
        ) as server:
            auth = {"Authorization": "Bearer t"} if token else {}
            for method, path, body in (
                ("GET", "/health", None),
                ("POST", "/v1/rollouts/enqueue", {"input": {}}),
                ("GET", "/dashboard/rollouts", None),
                ("GET", "/docs", None),
            ):
                response = httpx.request(method, server.url + path, json=body, headers={**auth, **EVIL})
                assert response.status_code == 421, (token, path)
                assert response.json()["error"] == "host_not_allowed"
            assert server.store.count_rollouts() == 0  # the refused enqueue wrote nothing
            for host in ("store.lan:8765", "localhost", f"127.0.0.1:{server.port}"):
                assert httpx.get(server.url + "/health", headers={"Host": host}).status_code == 200
            client = StoreClient(server.url, token=token)
            client.enqueue_rollout({"q": 1})  # the package's own client names the server as it should
            assert client.count_rollouts() == 1
            client.close()


def _start(args: list[str], tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgrad", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"(http://127\.0\.0\.1:\d+)", line)
        if match:
            return proc, match.group(1)
    proc.wait(10)
    raise AssertionError(f"{args} printed no URL (exit {proc.returncode})")


@pytest.mark.parametrize("command", ["dashboard", "store"])
def test_cli_servers_check_hosts_and_take_allowed_host(tmp_path: Path, command: str) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    if command == "dashboard":  # the dashboard reads a store that is there; the service makes its own
        from agentgrad.store import open_store

        open_store(db).close()
    args = (["dashboard", "--store", db] if command == "dashboard" else ["store", "serve", "--backend", db]) + [
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--allowed-host",
        "team.lan",
    ]
    env = {k: v for k, v in os.environ.items() if k != ALLOWED_HOSTS_ENV}
    env[ALLOWED_HOSTS_ENV] = "ci.lan"
    if command == "store":
        env["PYTHONUNBUFFERED"] = "1"
        args += ["--log-level", "info"]
    proc, url = _start(args, tmp_path, env)
    try:
        page = url + "/dashboard/rollouts"
        assert httpx.get(page, headers=EVIL).status_code == 421
        for host in ("team.lan", "ci.lan:80", "localhost"):
            assert httpx.get(page, headers={"Host": host}).status_code == 200, host
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert proc.returncode == 0
