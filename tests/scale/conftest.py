"""``make test-scale``: AgentGrad training through the Tinker API against a real SkyRL Tinker
server (JAX backend, on the CPU), started on 127.0.0.1 from ``scripts/skyrl-server`` (a uv
project: ``scripts/setup_scale_env.sh`` installs it, ~6 GB).

The tests are marked ``scale`` and skipped unless selected (``-m scale`` or
``AGENTGRAD_SCALE=1``). Each test gets a fresh server: a server keeps a LoRA slot until its
session's heartbeat times out, so a reused one runs out of adapters.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opt_in import skip_unless_selected

REPO = Path(__file__).resolve().parents[2]
SERVER_PROJECT = REPO / "scripts" / "skyrl-server"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_selected(config, items, "scale", "AGENTGRAD_SCALE", "make test-scale (or -m scale, AGENTGRAD_SCALE=1)")


@pytest.fixture(scope="session")
def qwen3_twin() -> Path:
    """The tiny calculator model built in Qwen3 form (SkyRL's JAX models have no Qwen2), cached
    beside the default tiny model; the first build takes the recipe's minutes."""
    from agentgrad.demo.tiny import BUILD_FORMAT, build_tiny_model
    from agentgrad.models.cache import models_cache_dir

    path = models_cache_dir() / "tiny-calc-qwen3"
    build = path / "agentgrad_build.json"
    if not (build.is_file() and f'"format": {BUILD_FORMAT},' in build.read_text()):
        build_tiny_model(path, architecture="qwen3")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def skyrl_server(qwen3_twin: Path, tmp_path: Path) -> Iterator[str]:
    """A fresh SkyRL Tinker server on 127.0.0.1 serving ``qwen3_twin``; its root URL."""
    uv = REPO / ".venv" / "bin" / "uv"
    if not (SERVER_PROJECT / ".venv").is_dir() or not uv.exists():
        pytest.fail("the SkyRL server environment is missing: run scripts/setup_scale_env.sh (make test-scale does)")
    port = _free_port()
    log = (tmp_path / "skyrl-server.log").open("w")
    env = {**os.environ, "PATH": f"{uv.parent}:{os.environ['PATH']}"}  # the server spawns its engine with `uv run`
    process = subprocess.Popen(
        [
            str(uv),
            "run",
            "--no-sync",
            "--extra",
            "tinker",
            "--extra",
            "jax",
            "-m",
            "skyrl.tinker.api",
            "--base-model",
            str(qwen3_twin),
            "--backend",
            "jax",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--checkpoints-base",
            str(tmp_path / "checkpoints"),
            "--database-url",
            f"sqlite:///{tmp_path / 'tinker.db'}",
        ],
        cwd=SERVER_PROJECT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, process, tmp_path / "skyrl-server.log")
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # the server and the engine it spawned, by our own group id
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _wait_until_serving(url: str, process: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the SkyRL server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"the SkyRL server did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")
