"""Agents: the user's code, seen through one small interface.

An agent takes a task and the resources of the current version (an ``LLM`` endpoint, prompt
templates…) and returns a reward — or emits rewards itself and returns None. Two ways in:

* subclass :class:`Agent` and implement ``rollout`` (or ``rollout_async``);
* decorate a function with :func:`rollout`: ``(task, llm)``, ``(task, prompt_template)`` or
  ``(task, resources)``, optionally also taking ``rollout``, sync or async.

(The module is ``agents``, not ``agent``, so that ``agentgrad.agent("name")`` — the tagging
scope from :mod:`agentgrad.emit` — stays reachable at the top level.)
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentgrad.errors import AgentImportError, InvalidInputError
from agentgrad.types import LLM, PromptTemplate, Resources, Rollout

#: What an agent may return: a reward, None (rewards were emitted), or a dict with ``reward``.
RolloutResult = float | int | None | Mapping[str, Any]


class Agent:
    """Base class for agents. Implement ``rollout`` or ``rollout_async``.

    ``training_rollout`` and ``validation_rollout`` default to ``rollout`` so an agent can
    behave differently while training (e.g. sample) and evaluating (e.g. greedy).
    """

    #: Tags spans of this agent; multi-agent systems use ``agentgrad.agent("name")`` scopes.
    name: str | None = None
    #: The resource name this agent reads its LLM under (``resources["main_llm"]``), when it reads a
    #: fixed one. Commands that publish an LLM for the agent (``agentgrad train``, ``dev``,
    #: ``runner``) use it when ``--llm-resource`` is not given; None: ``llm``.
    llm_resource: str | None = None

    #: Whether this class's ``rollout`` / ``rollout_async`` take the ``rollout`` argument: both
    #: ``(self, task, resources)`` and ``(self, task, resources, rollout)`` are accepted, read once
    #: when the subclass is defined (:meth:`__init_subclass__`).
    _rollout_takes_rollout: bool = True
    _async_takes_rollout: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "rollout" in cls.__dict__:
            cls._rollout_takes_rollout = _takes_rollout(cls, "rollout")
        if "rollout_async" in cls.__dict__:
            cls._async_takes_rollout = _takes_rollout(cls, "rollout_async")

    def rollout(self, task: Any, resources: Resources, rollout: Rollout) -> RolloutResult:
        raise NotImplementedError(f"{type(self).__name__} must implement rollout() or rollout_async()")

    async def rollout_async(self, task: Any, resources: Resources, rollout: Rollout) -> RolloutResult:
        return await asyncio.to_thread(self._call_rollout, task, resources, rollout)

    def training_rollout(self, task: Any, resources: Resources, rollout: Rollout) -> Any:
        return self._dispatch(task, resources, rollout)

    def validation_rollout(self, task: Any, resources: Resources, rollout: Rollout) -> Any:
        return self._dispatch(task, resources, rollout)

    def _dispatch(self, task: Any, resources: Resources, rollout: Rollout) -> Any:
        # Prefer whichever of the two the subclass implemented; async agents return a coroutine.
        if type(self).rollout_async is not Agent.rollout_async:
            if self._async_takes_rollout:
                return self.rollout_async(task, resources, rollout)
            return self.rollout_async(task, resources)  # type: ignore[call-arg]  # (task, resources) form
        return self._call_rollout(task, resources, rollout)

    def _call_rollout(self, task: Any, resources: Resources, rollout: Rollout) -> RolloutResult:
        if self._rollout_takes_rollout:
            return self.rollout(task, resources, rollout)
        return self.rollout(task, resources)  # type: ignore[call-arg]  # the (task, resources) form

    def run_for(self, rollout: Rollout, resources: Resources) -> Any:
        """Call the method for the rollout's mode; may return a coroutine (async agents)."""
        method = self.training_rollout if rollout.mode == "train" else self.validation_rollout
        return method(rollout.input, resources, rollout)


def _takes_rollout(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` takes ``(self, task, resources, rollout)`` (True) or
    ``(self, task, resources)`` (False); any other shape is refused when the class is defined."""
    try:
        params = list(inspect.signature(cls.__dict__[name]).parameters.values())[1:]  # without self
    except (TypeError, ValueError):  # no signature to read: pass everything
        return True
    kinds = {p.kind for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if inspect.Parameter.VAR_POSITIONAL in kinds or len(positional) >= 3:
        return True
    if len(positional) == 2 and len(required) <= 2:
        return False
    raise TypeError(
        f"{cls.__qualname__}.{name} must take (self, task, resources) or (self, task, resources, rollout); "
        f"it takes {['self', *(p.name for p in params)]}"
    )


_RESOURCE_PARAMS: dict[str, type | None] = {"llm": LLM, "prompt_template": PromptTemplate, "resources": None}


class FunctionAgent(Agent):
    """An :class:`Agent` made from a plain function by :func:`rollout`."""

    def __init__(self, func: Callable[..., Any]) -> None:
        params = list(inspect.signature(func).parameters)
        if not params:
            raise TypeError(f"@rollout function {func.__qualname__} must take the task as its first parameter")
        wanted = [p for p in params[1:] if p in _RESOURCE_PARAMS]
        if len(wanted) > 1:
            raise TypeError(
                f"@rollout function {func.__qualname__} asks for {wanted}: take only one of "
                "llm | prompt_template | resources (use resources to reach several items)"
            )
        self._resource_param = wanted[0] if wanted else None
        unknown = [p for p in params[1:] if p not in _RESOURCE_PARAMS and p != "rollout"]
        if unknown:
            raise TypeError(
                f"@rollout function {func.__qualname__} has unknown parameter(s) {unknown}: "
                "use (task, llm | prompt_template | resources [, rollout])"
            )
        self._wants_rollout = "rollout" in params
        self.func = func
        self.name = func.__name__
        functools.update_wrapper(self, func)

    def _arguments(self, resources: Resources, rollout: Rollout) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self._resource_param is not None:
            kwargs[self._resource_param] = _pick(resources, self._resource_param)
        if self._wants_rollout:
            kwargs["rollout"] = rollout
        return kwargs

    def _dispatch(self, task: Any, resources: Resources, rollout: Rollout) -> Any:
        return self.func(task, **self._arguments(resources, rollout))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Still callable as the plain function (handy in unit tests of the agent itself)."""
        return self.func(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle by reference to the decorated function, so runner processes can import it.
        return (_load_function_agent, (self.func.__module__, self.func.__qualname__))


def _load_function_agent(module: str, qualname: str) -> FunctionAgent:
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target if isinstance(target, FunctionAgent) else FunctionAgent(target)


def _pick(resources: Resources, param: str) -> Any:
    """The resource a parameter asks for: the item of that name, else the only one of its type."""
    kind = _RESOURCE_PARAMS[param]
    if kind is None:
        return resources
    if param in resources.items and isinstance(resources.items[param], kind):
        return resources.items[param]
    candidates = [v for v in resources.items.values() if isinstance(v, kind)]
    if len(candidates) == 1:
        return candidates[0]
    have = {k: type(v).__name__ for k, v in resources.items.items()}
    raise LookupError(
        f"the agent asks for {param!r} but resources {resources.resources_id!r} have "
        f"{'none' if not candidates else 'several'} of type {kind.__name__} (items: {have}); "
        f"name one {param!r}"
    )


def rollout(func: Callable[..., Any]) -> FunctionAgent:
    """Turn ``f(task, llm | prompt_template | resources [, rollout])`` into an :class:`Agent`."""
    return FunctionAgent(func)


#: What :func:`as_agent` and :func:`load_agent` accept, named in their errors.
EXPECTED_AGENT = "an Agent subclass, an Agent instance or a function (task, llm|prompt_template|resources[, rollout])"


class NotAnAgentError(TypeError):
    """What :func:`as_agent` was given is none of the shapes in :data:`EXPECTED_AGENT`."""


def as_agent(agent: Agent | type[Agent] | Callable[..., Any]) -> Agent:
    """An :class:`Agent` from any shape a user may hand over.

    An ``Agent`` instance is used as it is; an ``Agent`` subclass is instantiated with no
    arguments; a function is wrapped as with :func:`rollout`. Anything else is a
    :class:`NotAnAgentError` (a ``TypeError``) naming what was expected; so is a subclass whose
    constructor needs arguments, and a function of an unsupported shape.
    """
    if isinstance(agent, Agent):
        return agent
    if isinstance(agent, type):
        if not issubclass(agent, Agent):
            raise NotAnAgentError(
                f"{agent.__qualname__} is a class that does not subclass agentgrad.Agent; expected {EXPECTED_AGENT}"
            )
        return _instantiate(agent)
    if callable(agent):
        try:
            return FunctionAgent(agent)
        except NotAnAgentError:
            raise
        except TypeError as exc:  # a function of an unsupported shape: FunctionAgent names it
            raise NotAnAgentError(str(exc)) from None
        except (AttributeError, ValueError) as exc:  # a callable without a signature or a name
            raise NotAnAgentError(
                f"{_a(type(agent).__name__)} that cannot be read as a function ({exc}); expected {EXPECTED_AGENT}"
            ) from None
    raise NotAnAgentError(f"got {_a(type(agent).__name__)}; expected {EXPECTED_AGENT}")


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _instantiate(cls: type[Agent]) -> Agent:
    """``cls()``, or an error saying which constructor arguments it needs."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to read (a C-level __init__): just try it
        return cls()
    needed = [
        name
        for name, p in signature.parameters.items()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if needed:
        raise NotAnAgentError(
            f"the Agent subclass {cls.__qualname__} needs constructor argument(s) {', '.join(needed)}, "
            "and an agent named by its class is created with no arguments: give them defaults, or "
            f"create the agent in the module (my_agent = {cls.__qualname__}(...)) and name that instead"
        )
    return cls()  # errors raised by the user's own constructor keep their traceback


class ServedElsewhere(Agent):
    """The agent ``spec`` names, served by runners started elsewhere and never run here: what a
    trainer with no runners of its own holds when the agent's module, or the framework it is
    written with, is not installed where the trainer runs (``agentgrad train --runners 0``). Its
    ``trained_agents`` and ``llm_resource`` are not known here, so they are not read."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.name = spec.rpartition(":")[2].rpartition(".")[2] or None

    def rollout(self, task: Any, resources: Resources, rollout: Rollout) -> RolloutResult:
        raise RuntimeError(f"{self.spec} is served by runners started elsewhere: it cannot run in this process")


def agent_spec(agent: Agent) -> str | None:
    """The ``module:attribute`` that :func:`load_agent` (and so ``agentgrad runner``) loads back as
    ``agent``, for a command printed to the user; None when there is none to name: a lambda, a
    function defined inside another, an agent object (its constructor's arguments are not known).
    A function of the script being run is named by the script's path."""
    if isinstance(agent, ServedElsewhere):
        return agent.spec
    if not isinstance(agent, FunctionAgent):
        return None
    module, qualname = agent.func.__module__, agent.func.__qualname__
    if "<" in qualname:
        return None
    if module == "__main__":
        script = getattr(sys.modules["__main__"], "__file__", None)
        return f"{script}:{qualname}" if script else None
    return f"{module}:{qualname}"


def load_agent(spec: str) -> Agent:
    """``package.module:attribute`` → the agent (a file path also works for the module).

    The attribute may be anything :func:`as_agent` accepts: an ``Agent`` instance, an ``Agent``
    subclass (instantiated with no arguments) or a ``@rollout``-shaped function. The current
    directory (or the file's folder) goes on ``sys.path`` first, as ``python -m`` does, so that a
    user's own agent module is found without installing it. Errors are
    :class:`~agentgrad.errors.InvalidInputError` naming the spec and what was expected.
    """
    module_name, sep, attribute = spec.partition(":")
    if not sep or not attribute:
        raise InvalidInputError(
            f"agent must look like module:attribute (e.g. agentgrad.demo.agent:calc_agent), got {spec!r}"
        )
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        folder = str(path.parent)
        module_name = path.stem
    else:
        folder = str(Path.cwd())
    if not sys.path or sys.path[0] != folder:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AgentImportError(f"cannot import {module_name!r}: {exc}") from None
    target: Any = module
    for part in attribute.split("."):  # module:Class.attribute reaches a nested attribute
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidInputError(f"module {module_name!r} has no attribute {attribute!r}") from None
    try:
        return as_agent(target)
    except NotAnAgentError as exc:
        raise InvalidInputError(f"{spec} is not an agent: {exc}") from None
