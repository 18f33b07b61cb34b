"""The chaos suite's agent: no LLM, a little work, a span, a known reward.

Runners started by the CLI load it as ``chaos_agents:steady`` (``tests/support`` is on their
``PYTHONPATH``).
"""

from __future__ import annotations

import time
from typing import Any

from agentgrad import emit_message
from agentgrad.agents import rollout
from agentgrad.types import Rollout


@rollout
def steady(task: Any, rollout: Rollout) -> float:
    """Works ``task["sleep"]`` seconds and returns ``task["x"]``, writing one span on the way (so
    each rollout also writes through the store while it runs). A task with ``"hang": true`` hangs
    on its first attempt after saying ``hanging`` in a span: the test SIGKILLs its runner there."""
    if task.get("hang") and rollout.num_attempts == 1:
        emit_message("hanging")
        time.sleep(3600)
    time.sleep(float(task.get("sleep", 0)))
    emit_message(f"done {task['x']}")
    return float(task["x"])
