"""``make test-scale``: AgentGrad training through the Tinker API against a real SkyRL Tinker
server (JAX backend, on the CPU), started on 127.0.0.1 from ``scripts/skyrl-server`` (a uv
project: ``scripts/setup_scale_env.sh`` installs it, ~6 GB).

The tests are marked ``scale`` and skipped unless selected (``-m scale`` or
``AGENTGRAD_SCALE=1``). Each test gets a fresh server: a server keeps a LoRA slot until its
session's heartbeat times out, so a reused one runs out of adapters. The model is the tiny
model's Qwen3 twin (or ``$AGENTGRAD_SCALE_MODEL``): see :mod:`scale_run`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opt_in import skip_unless_selected
from scale_run import qwen3_twin as _qwen3_twin
from scale_run import skyrl_server as _skyrl_server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_selected(config, items, "scale", "AGENTGRAD_SCALE", "make test-scale (or -m scale, AGENTGRAD_SCALE=1)")


@pytest.fixture(scope="session")
def qwen3_twin() -> Path:
    """The model the scale tests train (the first build of the twin takes the recipe's minutes)."""
    return _qwen3_twin()


@pytest.fixture
def skyrl_server(qwen3_twin: Path, tmp_path: Path) -> Iterator[str]:
    """A fresh SkyRL Tinker server on 127.0.0.1 serving ``qwen3_twin``; its root URL."""
    with _skyrl_server(qwen3_twin, tmp_path / "server") as url:
        yield url
