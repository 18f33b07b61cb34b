"""examples/math end to end: the AutoGen calculator agent through the capture proxy, on the tiny model.

Every call the `AssistantAgent` makes must be stored under its name (`calc`) with token ids that
decode to what AutoGen received; the rollout's reward is the calculator demo's answer check. The
tiny model knows the calculator task, so some answers are right — not asserted (a quality claim
is a learning run's, not this test's).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from capture_check import Capture, run_and_check

from agentgrad import semconv
from agentgrad.agents import load_agent
from agentgrad.demo.calc import generate_problems

pytest.importorskip("autogen_agentchat", reason="AutoGen AgentChat is not installed (make frameworks)")
pytest.importorskip("autogen_ext.models.openai", reason="autogen-ext[openai] is not installed (make frameworks)")

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py

AGENT = Path(__file__).parents[2] / "examples" / "math" / "math_agent.py"


def test_math_agent_through_the_proxy(capture: Capture) -> None:
    tasks = generate_problems(2, seed=0, split="test")
    spans = run_and_check(capture, load_agent(f"{AGENT}:math_agent"), tasks=tasks)
    assert {s.attributes[semconv.AGENT_NAME] for s in spans} == {"calc"}  # the AssistantAgent's name
    rollout_ids = {s.rollout_id for s in spans}
    assert len(rollout_ids) == 2
    for rollout_id in rollout_ids:
        rollout = capture.store.get_rollout(rollout_id)
        assert rollout.reward in (0.0, 1.0), rollout
