"""Plain openai 3.x client (openai 2.x runs the same agents in tests/frameworks_compat)."""

from __future__ import annotations

import pytest
from capture_check import Capture, run_and_check
from openai_agent import openai_agent, openai_streaming_agent

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py


def test_openai_sync_tool_loop(capture: Capture) -> None:
    run_and_check(capture, openai_agent, tasks=["What is 12 + 7?", "Calculate 6 * 7."])


def test_openai_async_streamed_tool_loop(capture: Capture) -> None:
    spans = run_and_check(capture, openai_streaming_agent)
    assert all(s.attributes["agentgrad.llm.streamed"] for s in spans)
