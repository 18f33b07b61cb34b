"""Which agent is making an LLM call right now, as the agent's own framework names it.

Training selects agents by name (``agent_match``), so every captured call needs the name of the
agent that made it — without the user adding ``agentgrad.agent(...)`` scopes to their code. The
openai-client hook (:mod:`agentgrad.tracing.instrument`) asks :func:`current_agent_name` while it
builds each request's headers, so this runs on every LLM call: each resolver is a few dict and
context-variable lookups, and none imports a framework (a framework that is not in
``sys.modules`` cannot be running).

The rule, first match wins:

1. an explicit ``agentgrad.agent("name")`` scope (the user said so);
2. the framework's own notion of the calling agent:

   * LangGraph — the graph node running now, read from LangChain's context variable
     (``var_child_runnable_config``, whose metadata LangGraph fills with ``langgraph_node`` and
     ``langgraph_checkpoint_ns``). A node of a subgraph is named by its path,
     ``parent_node/node``, because a subgraph's nodes are often generic (``agent``, ``tools``);
   * frameworks with no such variable get their agent entry point wrapped once (:data:`PATCHES`),
     setting :data:`_entered` for the duration: OpenAI Agents SDK (the turn's ``Agent.name``, so a
     handoff switches it), AutoGen (the ``name`` of the agent being invoked, by ``run``,
     ``run_stream`` or a team), CrewAI (the agent's ``role``), smolagents (``MultiStepAgent.name``)
     and LlamaIndex agent workflows (the running agent's ``name``);

   when both a wrapped agent and a LangGraph node are active, the inner one wins: an agent
   entered inside a node remembers that node, so a *different* node now means the node is inner;
3. the rollout's own agent name (what the runner records, e.g. the ``@rollout`` function's name).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from agentgrad.context import RolloutContext
from agentgrad.tracing.post_import import when_imported

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Entered:
    """The innermost framework agent entered through a wrapped entry point."""

    name: str
    #: The LangGraph node that was running when the agent was entered (None: none was).
    node: str | None


_entered: contextvars.ContextVar[_Entered | None] = contextvars.ContextVar("agentgrad_framework_agent", default=None)


# ---- reading the name ----------------------------------------------------------------------------


def current_agent_name(context: RolloutContext) -> str | None:
    """The name to record for an LLM call made now in ``context``'s rollout (see the module doc)."""
    if context.agent_scoped:
        return context.agent_name
    return framework_agent_name() or context.agent_name


def framework_agent_name() -> str | None:
    """The calling agent's name as its framework knows it, or None outside any known framework."""
    entered = _entered.get()
    node = langgraph_node()
    if entered is None:
        return node
    if node is None or node == entered.node:
        return entered.name
    return node  # a LangGraph node started inside the entered agent: the node is inner


def langgraph_node() -> str | None:
    """The LangGraph node running now (``parent/node`` inside a subgraph), if LangChain is loaded."""
    config_module = sys.modules.get("langchain_core.runnables.config")
    if config_module is None:
        return None
    config = config_module.var_child_runnable_config.get()
    return langgraph_node_of(config) if config else None


def langgraph_node_of(config: Any) -> str | None:
    """The node a LangChain runnable config belongs to: ``langgraph_node``, as a path in a subgraph.

    ``langgraph_checkpoint_ns`` is ``node:task_id`` at the top level and
    ``parent:task_id|node:task_id`` inside a subgraph (LangGraph reserves ``|`` and ``:``).
    """
    metadata = config.get("metadata") if isinstance(config, dict) else None
    if not isinstance(metadata, dict):
        return None
    node = metadata.get("langgraph_node")
    if not isinstance(node, str) or not node:
        return None
    namespace = metadata.get("langgraph_checkpoint_ns")
    if isinstance(namespace, str) and "|" in namespace:
        path = [part.partition(":")[0] for part in namespace.split("|")]
        if path[-1] == node and all(path):
            return "/".join(path)
    return node


# ---- setting the name: wrapped framework entry points --------------------------------------------


@contextlib.contextmanager
def entered_agent(name: Any) -> Iterator[None]:
    """Attribute calls inside to the framework agent ``name`` (a non-string or empty name: no change)."""
    if not isinstance(name, str) or not name:
        yield
        return
    token = _entered.set(_Entered(name, langgraph_node()))
    try:
        yield
    finally:
        _reset(token)


def _reset(token: contextvars.Token[_Entered | None]) -> None:
    try:
        _entered.reset(token)
    except ValueError:
        # Entered in one context, left in another (an async generator resumed by another task):
        # restore the value from before, as the framework's own OTel span does.
        _entered.set(None if token.old_value is contextvars.Token.MISSING else token.old_value)


NameOf = Callable[[tuple[Any, ...], dict[str, Any]], Any]


def _safe_name(name_of: NameOf, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return name_of(args, kwargs)
    except Exception:  # reading a name must never break the agent
        log.debug("could not read the agent's name", exc_info=True)
        return None


def named(func: Callable[..., Any], name_of: NameOf) -> Callable[..., Any]:
    """``func`` running under the agent name ``name_of(args, kwargs)``.

    Coroutine functions are covered until they return; a sync function returning a generator
    (smolagents' streamed ``run``) is covered during each step of the generator, never between
    steps (that is the consumer's code).
    """
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with entered_agent(_safe_name(name_of, args, kwargs)):
                return await func(*args, **kwargs)

        wrapper: Callable[..., Any] = run_async
    else:

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            name = _safe_name(name_of, args, kwargs)
            with entered_agent(name):
                result = func(*args, **kwargs)
            return _named_steps(result, name) if inspect.isgenerator(result) else result

        wrapper = run
    wrapper._agentgrad_original = func  # type: ignore[attr-defined]
    return wrapper


def _named_steps(steps: Generator[Any, Any, Any], name: Any) -> Generator[Any, None, Any]:
    try:
        while True:
            with entered_agent(name):
                try:
                    item = next(steps)
                except StopIteration as stop:
                    return stop.value
            yield item
    finally:
        steps.close()


def named_span(func: Callable[..., Any]) -> Callable[..., Any]:
    """A context-manager function whose first argument is the agent's name (AutoGen's
    ``trace_invoke_agent_span(agent_name, ...)``), also attributing calls inside to that name."""

    @functools.wraps(func)
    @contextlib.contextmanager
    def span(*args: Any, **kwargs: Any) -> Iterator[Any]:
        name = args[0] if args else kwargs.get("agent_name")
        with func(*args, **kwargs) as value, entered_agent(name):
            yield value

    span._agentgrad_original = func  # type: ignore[attr-defined]
    return span


def attribute(name: str) -> NameOf:
    """The agent's name is ``self.<name>`` (methods)."""
    return lambda args, kwargs: getattr(args[0], name, None)


def argument(func: Callable[..., Any], parameter: str, read: Callable[[Any], Any]) -> NameOf:
    """The agent's name is ``read(<the call's argument "parameter">)``."""
    position = list(inspect.signature(func).parameters).index(parameter)

    def name_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        value = kwargs[parameter] if parameter in kwargs else args[position] if len(args) > position else None
        return None if value is None else read(value)

    return name_of


@dataclass(frozen=True)
class Patch:
    """Wrap ``module.target`` (``function`` or ``Class.method``) with ``wrap(original)``."""

    module: str
    target: str
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]]

    def apply(self, module: ModuleType) -> None:
        *owner_path, attr = self.target.split(".")
        owner: Any = module
        for part in owner_path:
            owner = getattr(owner, part, None)
        original = getattr(owner, attr, None) if owner is not None else None
        if original is None:  # another version of the framework: its calls keep the fallback name
            log.debug("%s.%s not found: its agents' names are not inferred", self.module, self.target)
            return
        if hasattr(original, "_agentgrad_original"):
            return
        setattr(owner, attr, self.wrap(original))


def _with_self(attr: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda func: named(func, attribute(attr))


def _with_argument(parameter: str, read: Callable[[Any], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda func: named(func, argument(func, parameter, read))


def _public_agent_name(bindings: Any) -> Any:
    return bindings.public_agent.name


#: The wrapped entry points, each where the framework knows which agent is running.
PATCHES: tuple[Patch, ...] = (
    # OpenAI Agents SDK: one turn of the current agent; after a handoff the next turn is the new
    # agent's. (Its tracing spans cannot be used: with tracing disabled they have no parents.)
    Patch("agents.run_internal.run_loop", "get_new_response", _with_argument("bindings", _public_agent_name)),
    Patch("agents.run_internal.run_loop", "run_single_turn_streamed", _with_argument("bindings", _public_agent_name)),
    # AutoGen: the invoke_agent span it opens around an agent's run, run_stream, or turn in a team.
    Patch("autogen_agentchat.agents._base_chat_agent", "trace_invoke_agent_span", named_span),
    Patch("autogen_agentchat.teams._group_chat._chat_agent_container", "trace_invoke_agent_span", named_span),
    # CrewAI: an agent executing a task in a crew, or kicked off on its own.
    *(
        Patch("crewai.agent.core", f"Agent.{method}", _with_self("role"))
        for method in ("execute_task", "aexecute_task", "kickoff", "kickoff_async")
    ),
    # smolagents: a run of an agent (a managed agent's run too).
    Patch("smolagents.agents", "MultiStepAgent.run", _with_self("name")),
    # LlamaIndex: the workflow step that lets an agent take its step (single agent, multi-agent).
    Patch("llama_index.core.agent.workflow.base_agent", "BaseWorkflowAgent.run_agent_step", _with_self("name")),
    Patch(
        "llama_index.core.agent.workflow.multi_agent_workflow",
        "AgentWorkflow.run_agent_step",
        _with_argument("ev", lambda event: event.current_agent_name),
    ),
)


def install(patches: tuple[Patch, ...] = PATCHES) -> None:
    """Apply each patch now if its module is imported, else as soon as it is (idempotent)."""
    for patch in patches:
        when_imported(patch.module, patch.apply)
