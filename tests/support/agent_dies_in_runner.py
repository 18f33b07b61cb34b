"""An agent whose module cannot be imported in a runner process (a spawned child), as when it
needs something only the parent has: the pool's processes die while starting, before the agent."""

from __future__ import annotations

import multiprocessing

from agentgrad.agents import rollout

# True while a spawned child unpickles what its parent sent (the agent): where this import happens.
if getattr(multiprocessing.current_process(), "_inheriting", False):
    raise ImportError("agent_dies_in_runner refuses to be imported in a child process")


@rollout
def agent(task: object, resources: object) -> float:
    return 1.0
