"""The plain-openai agents of the main suite, under openai 2.x."""

from __future__ import annotations

import openai
from capture_check import Capture, run_and_check
from openai_agent import openai_agent, openai_streaming_agent


def test_openai2_is_what_runs() -> None:
    assert openai.__version__.startswith("2.")


def test_openai2_sync_tool_loop(capture: Capture) -> None:
    run_and_check(capture, openai_agent)


def test_openai2_async_streamed_tool_loop(capture: Capture) -> None:
    run_and_check(capture, openai_streaming_agent)
