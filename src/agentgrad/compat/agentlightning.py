"""Agent Lightning 0.x names, mapped onto AgentGrad: ``from agentgrad.compat import agentlightning as agl``.

What each name maps to, what differs and what is refused: docs/migrating-from-agent-lightning.md.
A name of Agent Lightning's that AgentGrad cannot support raises :class:`UnsupportedError` (also
from ``from agentlightning import Name``), saying what to use instead; a name this module does not
know is an ordinary ``AttributeError``.

This module holds the agent interface (``LitAgent``, ``@rollout``) and :func:`install_alias`;
the types, emitters, algorithms and the Trainer live in the ``_al_*`` modules beside it.

``LitAgent`` *is* an AgentGrad :class:`~agentgrad.agents.Agent`: the runner, ``load_agent`` and
the CLI take it as they are. What it adds is the calling convention Agent Lightning agents are
written for: the resources as a plain mapping of ``LLM`` / ``PromptTemplate`` (with
``sampling_parameters`` and ``get_base_url``), a rollout that carries its ``attempt``, the
``training_rollout`` / ``validation_rollout`` split and their ``*_async`` twins, ``self.tracer``.

``import agentlightning`` itself resolves here after :func:`install_alias`: a ``sys.modules``
alias, not a top-level package of ours (a package named ``agentlightning`` in AgentGrad's wheel
would shadow, or be shadowed by, the real one depending on install order; the alias checks first
and steps aside when the real one is installed). Runner processes start fresh (``spawn``-like) and
unpickle the agent: an agent created under the alias is pickled so that the child installs the
alias before it imports the agent's module.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import logging
import pickle
import sys
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from agentgrad.agents import Agent
from agentgrad.compat._al_algorithms import APO, VERL
from agentgrad.compat._al_emit import (
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    find_final_reward,
    find_reward_spans,
    get_reward_value,
    is_reward_span,
    reward,
    setup_logging,
)
from agentgrad.compat._al_trainer import TracerTraceToTriplet, TraceToMessages, Trainer
from agentgrad.compat._al_types import (
    LLM,
    Attempt,
    AttemptedRollout,
    Dataset,
    NamedResources,
    PromptTemplate,
    Rollout,
    RolloutConfig,
    RolloutMode,
    UnsupportedError,
    attempted_rollout,
    named_resources,
)
from agentgrad.context import current_context
from agentgrad.errors import AgentGradError

if TYPE_CHECKING:
    from agentgrad import types as ag

T = TypeVar("T")

__version__ = "0.3.0+agentgrad"
#: Marks this module as AgentGrad's stand-in (:func:`install_alias` checks it).
__agentgrad_compat__ = True


# ---- the agent interface ------------------------------------------------------------------------


class Tracer:
    """What ``self.tracer`` gives an agent. AgentGrad captures every LLM call at its proxy and tags
    requests with the rollout (``agentgrad.instrument``), so there is nothing to set up here."""

    def get_langchain_handler(self, tags: list[str] | None = None) -> Any:
        """A LangChain callback handler that does nothing (capture happens at the proxy); None
        when LangChain is not installed. Either way ``callbacks=[handler] if handler else []``
        and ``callbacks=[handler]`` both work."""
        try:
            from langchain_core.callbacks import BaseCallbackHandler
        except ImportError:
            return None
        return _quiet_handler(BaseCallbackHandler)

    get_langchain_callback_handler = get_langchain_handler

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise UnsupportedError(
            f"tracer.{name} is not supported by AgentGrad: LLM calls are captured at its proxy; "
            "record your own spans with agentgrad.operation(...) or agl.emit_message/emit_object"
        )


@functools.cache
def _quiet_handler_class(base: type) -> type:
    return type(
        "AgentGradLangChainHandler",
        (base,),
        {"__doc__": "A callback handler that records nothing (AgentGrad captures at its proxy)."},
    )


def _quiet_handler(base: type) -> Any:
    return _quiet_handler_class(base)()


class LitAgent(Agent, Generic[T]):
    """``agentlightning.LitAgent``: implement ``rollout`` (or ``rollout_async``), or the
    ``training_rollout`` / ``validation_rollout`` pair (or their ``*_async`` twins).

    ``trained_agents`` (a regular expression over agent names) is used as the Trainer's
    ``agent_match`` when its adapter gives none. The LLM resource is read as ``main_llm`` by the
    CLI's default (``llm_resource``), Agent Lightning's convention.
    """

    llm_resource: str | None = "main_llm"
    trained_agents: str | None = None
    _trainer_ref: weakref.ReferenceType[Any] | None = None

    def __init__(self, *, trained_agents: str | None = None) -> None:
        self.trained_agents = trained_agents
        self._trainer_ref = None

    # ---- Agent Lightning's interface ---------------------------------------------------------------
    def is_async(self) -> bool:
        """Whether the subclass implements any of the ``*_async`` methods (they are then used)."""
        cls = type(self)
        return any(
            getattr(cls, name) is not getattr(LitAgent, name)
            for name in ("rollout_async", "training_rollout_async", "validation_rollout_async")
        )

    def rollout(self, task: T, resources: Any, rollout: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement rollout() or rollout_async()")

    async def rollout_async(self, task: T, resources: Any, rollout: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement rollout_async() or rollout()")

    def training_rollout(self, task: T, resources: Any, rollout: Any) -> Any:
        return self.rollout(task, resources, rollout)

    def validation_rollout(self, task: T, resources: Any, rollout: Any) -> Any:
        return self.rollout(task, resources, rollout)

    async def training_rollout_async(self, task: T, resources: Any, rollout: Any) -> Any:
        return await self.rollout_async(task, resources, rollout)

    async def validation_rollout_async(self, task: T, resources: Any, rollout: Any) -> Any:
        return await self.rollout_async(task, resources, rollout)

    @property
    def tracer(self) -> Tracer:
        return Tracer()

    def set_trainer(self, trainer: Any) -> None:
        self._trainer_ref = weakref.ref(trainer)

    @property
    def trainer(self) -> Any:
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if trainer is None:
            raise ValueError(
                "Trainer has not been set for this agent (it is set by Trainer.fit()/dev() in the "
                "process that called them; runner processes have none)"
            )
        return trainer

    @property
    def runner(self) -> Any:
        raise UnsupportedError(
            "LitAgent.runner is not available in AgentGrad: the runner is AgentGrad's own; "
            "read the rollout and its attempt from the rollout argument"
        )

    # ---- AgentGrad's side ------------------------------------------------------------------------
    def run_for(self, rollout: ag.Rollout, resources: ag.Resources) -> Any:
        """The method for the rollout's mode, with Agent Lightning's arguments; a coroutine for
        async agents (the runner awaits it)."""
        context = current_context()
        if context is None or context.rollout.rollout_id != rollout.rollout_id:
            raise AgentGradError("a LitAgent runs inside a rollout started by an AgentGrad runner")
        view, named = attempted_rollout(rollout, context.attempt), named_resources(resources)
        training = rollout.mode == "train"
        if self.is_async():
            method = self.training_rollout_async if training else self.validation_rollout_async
        else:
            method = self.training_rollout if training else self.validation_rollout
        return method(rollout.input, named, view)

    def __reduce__(self) -> tuple[Any, ...]:
        state = {k: v for k, v in vars(self).items() if k != "_trainer_ref"}
        return (_rebuild, (alias_installed(), type(self).__module__, type(self).__qualname__, pickle.dumps(state)))


def _rebuild(alias: bool, module: str, qualname: str, state: bytes) -> Any:
    """Recreate a pickled LitAgent in a runner process, after installing the alias its module needs."""
    if alias:
        install_alias()
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    agent = cls.__new__(cls)
    agent.__dict__.update(pickle.loads(state))
    return agent


#: The resource parameters a ``@rollout`` function may take, and the type each receives.
_RESOURCE_PARAMS: dict[str, type] = {"llm": LLM, "prompt_template": PromptTemplate}


class FunctionalLitAgent(LitAgent[T]):
    """The agent ``@rollout`` makes of ``f(task, llm | prompt_template [, rollout])`` (sync or async)."""

    def __init__(self, func: Callable[..., Any]) -> None:
        super().__init__()
        params = list(inspect.signature(func).parameters)
        resources = [p for p in params[1:] if p in _RESOURCE_PARAMS]
        unknown = [p for p in params[1:] if p not in _RESOURCE_PARAMS and p != "rollout"]
        if not params or len(resources) > 1 or unknown:
            raise TypeError(
                f"@rollout function {func.__qualname__} must look like f(task, llm [, rollout]) or "
                f"f(task, prompt_template [, rollout]); it takes {params}"
            )
        self.func = func
        self.name = func.__name__
        self._resource = resources[0] if resources else None
        self._wants_rollout = "rollout" in params
        self._async = inspect.iscoroutinefunction(func)

    def is_async(self) -> bool:
        return self._async

    def _call(self, task: Any, resources: Any, rollout: Any) -> Any:
        kwargs: dict[str, Any] = {}
        if self._resource is not None:
            kwargs[self._resource] = _only(resources, _RESOURCE_PARAMS[self._resource], self._resource)
        if self._wants_rollout:
            kwargs["rollout"] = rollout
        return self.func(task, **kwargs)

    rollout = _call
    rollout_async = _call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Still callable as the plain function."""
        return self.func(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_function, (alias_installed(), self.func.__module__, self.func.__qualname__))


def _rebuild_function(alias: bool, module: str, qualname: str) -> Any:
    if alias:
        install_alias()
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target if isinstance(target, FunctionalLitAgent) else FunctionalLitAgent(target)


def _only(resources: Any, kind: type, param: str) -> Any:
    """The one resource of ``kind`` (Agent Lightning picks the first; two are ambiguous here)."""
    found = [item for item in resources.values() if isinstance(item, kind)]
    if param in resources and isinstance(resources[param], kind):
        return resources[param]
    if len(found) == 1:
        return found[0]
    raise LookupError(
        f"the @rollout function asks for {param!r} but the resources have "
        f"{'none' if not found else len(found)} of type {kind.__name__} (names: {sorted(resources)}); "
        f"publish exactly one, or name it {param!r}"
    )


def rollout(func: Callable[..., Any]) -> FunctionalLitAgent[Any]:
    """``@agl.rollout``: an agent from ``f(task, llm | prompt_template [, rollout])``."""
    return FunctionalLitAgent(func)


def llm_rollout(func: Callable[..., Any] | None = None, *, strip_proxy: bool = True) -> Any:
    """``@agl.llm_rollout``: :func:`rollout` for ``f(task, llm [, rollout])``. ``strip_proxy`` has
    nothing to strip (the endpoint already names the rollout); it is accepted only as True."""
    if not strip_proxy:
        raise UnsupportedError(
            "llm_rollout(strip_proxy=False) is not supported: AgentGrad's LLM endpoint is the "
            "capture proxy's URL for the rollout; call llm.get_base_url(rollout_id, attempt_id)"
        )
    return rollout if func is None else rollout(func)


def prompt_rollout(func: Callable[..., Any] | None = None) -> Any:
    """``@agl.prompt_rollout``: :func:`rollout` for ``f(task, prompt_template [, rollout])``."""
    return rollout if func is None else rollout(func)


# ---- import agentlightning -------------------------------------------------------------------------

ALIASED_MODULES = (
    "agentlightning",
    "agentlightning.litagent",
    "agentlightning.types",
    "agentlightning.reward",
    "agentlightning.emitter",
    "agentlightning.trainer",
    "agentlightning.algorithm",
    "agentlightning.algorithm.apo",
    "agentlightning.algorithm.verl",
    "agentlightning.adapter",
    "agentlightning.logging",
)


def install_alias() -> bool:
    """Make ``import agentlightning`` give :mod:`agentgrad.compat.agentlightning`.

    Returns True when the alias is in place (installed now or before), False when a real
    ``agentlightning`` is installed — that one is then what ``import agentlightning`` gives, and
    nothing is changed. Runner processes started by AgentGrad install the alias again before they
    load an agent that was created under it.
    """
    current = sys.modules.get("agentlightning")
    if current is not None:
        return getattr(current, "__agentgrad_compat__", False)
    if importlib.util.find_spec("agentlightning") is not None:
        logging.getLogger(__name__).info("a real agentlightning is installed: not aliasing it to agentgrad.compat")
        return False
    module = sys.modules[__name__]
    for name in ALIASED_MODULES:
        sys.modules.setdefault(name, module)
    return True


def alias_installed() -> bool:
    """Whether ``agentlightning`` in this process is this module (runner processes then alias it too)."""
    return getattr(sys.modules.get("agentlightning"), "__agentgrad_compat__", False)


# ---- the rest of the names ------------------------------------------------------------------------

__all__ = [
    "APO",
    "LLM",
    "VERL",
    "Attempt",
    "AttemptedRollout",
    "Dataset",
    "FunctionalLitAgent",
    "LitAgent",
    "NamedResources",
    "PromptTemplate",
    "Rollout",
    "RolloutConfig",
    "RolloutMode",
    "TraceToMessages",
    "Tracer",
    "TracerTraceToTriplet",
    "Trainer",
    "UnsupportedError",
    "emit_exception",
    "emit_message",
    "emit_object",
    "emit_reward",
    "find_final_reward",
    "find_reward_spans",
    "get_reward_value",
    "is_reward_span",
    "llm_rollout",
    "prompt_rollout",
    "reward",
    "rollout",
    "setup_logging",
]

_STORE = "AgentGrad's stores: agentgrad.open_store('memory' | 'path/to/file.db' | 'postgresql://…' | 'http://…')"
_TRACER = "AgentGrad captures LLM calls at its proxy and tags requests with the rollout (agentgrad.instrument())"
_RUNNER = "AgentGrad's runner: agentgrad.Runner(agent, store), or Trainer(n_runners=N)"

#: Agent Lightning names AgentGrad does not offer, and what to use instead.
UNSUPPORTED: dict[str, str] = {
    "InMemoryLightningStore": _STORE,
    "LightningStore": _STORE,
    "SqliteLightningStore": _STORE,
    "LightningStoreServer": "`agentgrad store serve` (the store as an HTTP service)",
    "LightningStoreClient": "agentgrad.open_store('http://host:port')",
    "LitAgentRunner": _RUNNER,
    "Runner": _RUNNER,
    "AgentOpsTracer": _TRACER,
    "OtelTracer": _TRACER,
    "WeaveTracer": _TRACER,
    "DummyTracer": _TRACER,
    "LLMProxy": "agentgrad.LLMProxy(store, upstream_url) (started with .start() or `with`), passed as "
    "Trainer(llm_proxy=...)",
    "ProxyLLM": "agl.LLM: AgentGrad's runner points it at the proxy for each rollout already",
    "Baseline": "trainer.dev(agent, dataset), or agentgrad.Evaluate",
    "FastAlgorithm": "trainer.dev(agent, dataset)",
    "Algorithm": "agentgrad.algorithms.base.Algorithm (run(context) with an AlgorithmContext)",
    "algo": "a subclass of agentgrad.algorithms.base.Algorithm",
    "ExecutionStrategy": "Trainer(n_runners=1) runs the runner in a thread, n_runners>1 in processes",
    "SharedMemoryExecutionStrategy": "Trainer(n_runners=1)",
    "ClientServerExecutionStrategy": "Trainer(n_runners=N), or `agentgrad runner` processes on a served store",
    "Hook": "subclass agentgrad.Runner, or read spans from the store after the rollout",
    "operation": "agentgrad.operation (the same idea: a block or function recorded as a span)",
    "emit_annotation": "agl.emit_object(...) or agl.emit_message(...)",
    "AgentLightningClient": "agentgrad.open_store('http://…') (the store's HTTP client)",
    "AgentLightningServer": "`agentgrad store serve`",
    "DevTaskLoader": "trainer.dev(agent, dataset)",
    "TraceAdapter": "TracerTraceToTriplet(agent_match=...): AgentGrad's adapter is "
    "agentgrad.adapters.TransitionAdapter",
    "LlmProxyTraceToTriplet": "TracerTraceToTriplet(agent_match=...): AgentGrad always reads the proxy's spans",
    "configure_logger": "agl.setup_logging(...)",
    "setup_module_logging": "agl.setup_logging(...)",
}


def __getattr__(name: str) -> Any:
    if name in UNSUPPORTED:
        raise UnsupportedError(
            f"agentlightning.{name} is not supported by AgentGrad's compatibility layer: use "
            f"{UNSUPPORTED[name]} (docs/migrating-from-agent-lightning.md)"
        )
    raise AttributeError(f"module 'agentlightning' (agentgrad.compat.agentlightning) has no attribute {name!r}")
