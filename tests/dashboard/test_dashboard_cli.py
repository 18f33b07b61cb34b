"""``agentgrad dashboard``: serves a local store file, enforces the token, stops cleanly on SIGTERM."""

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

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from dashboard_data import fill_by_hand  # noqa: E402

from agentgrad.store import open_store  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"


def test_dashboard_command_serves_a_store_file_and_stops_on_sigterm(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(url, watchdog=False) as store:
        fill_by_hand(store)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "AGENTGRAD_TOKEN": "cli-token",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentgrad",
            "dashboard",
            "--store",
            url,
            "--port",
            "0",
            "--tokenizer",
            str(SRC / "agentgrad" / "demo" / "data" / "tiny-calc"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        match = re.search(r"(http://127\.0\.0\.1:\d+)/dashboard/", line)
        assert match, f"no URL in {line!r}; stderr: {process.stderr.read() if process.stderr else ''}"
        base = match.group(1)
        with httpx.Client(base_url=base, timeout=10, follow_redirects=True) as client:
            for _ in range(100):  # the socket is bound before the line is printed; wait for the app
                try:
                    denied = client.get("/dashboard/rollouts")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
            else:
                pytest.fail(f"{base} never answered")
            assert denied.status_code == 401
            allowed = client.get("/dashboard/rollouts", headers={"Authorization": "Bearer cli-token"})
            assert allowed.status_code == 200 and "ro-good" in allowed.text
            assert client.get("/", headers={"Authorization": "Bearer cli-token"}).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr


def test_tokenizer_flags_map_models_to_paths() -> None:
    from agentgrad.cli.dashboard import parse_tokenizers

    assert parse_tokenizers([]) == {}
    assert parse_tokenizers(["runs/best", "tiny-calc=/m/tok.json", "org/model=a=b"]) == {
        "*": "runs/best",
        "tiny-calc": "/m/tok.json",
        "org/model": "a=b",
    }
    with pytest.raises(SystemExit, match="MODEL=PATH"):
        parse_tokenizers(["=path"])
