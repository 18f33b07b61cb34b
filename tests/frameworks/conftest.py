"""Framework integration tests: idiomatic agents, unchanged, through the proxy and the engine."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # else the Agents SDK exports to OpenAI

from capture_check import Capture, serve_upstream  # noqa: E402


@pytest.fixture(scope="session")
def capture() -> Iterator[Capture]:
    with serve_upstream() as served:
        yield served
