"""The openai-2.x suite (CrewAI, LlamaIndex, plain openai 2.x), run by tests/frameworks/test_fw_compat_venv.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # never OTEL_SDK_DISABLED: it would switch ours off
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from capture_check import Capture, serve_upstream  # noqa: E402


@pytest.fixture(scope="session")
def capture() -> Iterator[Capture]:
    with serve_upstream() as served:
        yield served
