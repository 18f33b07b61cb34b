"""``agentlightning.Trainer`` over AgentGrad's :class:`~agentgrad.trainer.Trainer`.

``Trainer(n_runners=, initial_resources=, adapter={"agent_match": ...}, algorithm=)`` with
``fit(agent, train_dataset=, val_dataset=)`` and ``dev(agent, dataset)``. What differs:

* every LLM call goes through AgentGrad's capture proxy (that is how token ids are recorded):
  ``fit`` with ``VERL`` serves the model with a :class:`~agentgrad.training.local.LocalPolicy`
  and publishes it as ``main_llm`` (Agent Lightning's name); ``dev`` starts a proxy in front of the
  one LLM endpoint of ``initial_resources`` unless ``llm_proxy=`` names one;
* the store is AgentGrad's (``store=`` takes a :class:`~agentgrad.store.protocol.Store` or URL);
* components AgentGrad has no counterpart for (``tracer``, ``runner``, ``strategy``, ``hooks``…)
  are refused with what to use instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgrad.agents import Agent, as_agent
from agentgrad.algorithms.base import Algorithm
from agentgrad.compat._al_algorithms import APO, VERL
from agentgrad.compat._al_types import UnsupportedError
from agentgrad.store import open_store
from agentgrad.store.protocol import Store
from agentgrad.trainer import Trainer as _Trainer
from agentgrad.types import LLM

#: Agent Lightning's LLM resource name: what VERL publishes and its examples read.
MAIN_LLM = "main_llm"


class TracerTraceToTriplet:
    """``agentlightning.TracerTraceToTriplet``: the adapter settings; AgentGrad honours
    ``agent_match`` (a regular expression over agent names). Its other settings describe how
    Agent Lightning reads OpenTelemetry traces, which AgentGrad does not need: they are accepted
    only at their defaults."""

    def __init__(
        self,
        repair_hierarchy: bool = True,
        llm_call_match: str = r"openai\.chat\.completion",
        agent_match: str | None = None,
        exclude_llm_call_in_reward: bool = True,
        reward_match: Any = None,
        _skip_empty_token_spans: bool = False,
    ) -> None:
        given = {
            "repair_hierarchy": (repair_hierarchy, True),
            "llm_call_match": (llm_call_match, r"openai\.chat\.completion"),
            "exclude_llm_call_in_reward": (exclude_llm_call_in_reward, True),
            "reward_match": (reward_match, None),
            "_skip_empty_token_spans": (_skip_empty_token_spans, False),
        }
        changed = [name for name, (value, default) in given.items() if value != default]
        if changed:
            raise UnsupportedError(
                f"adapter setting(s) {changed} are not supported: AgentGrad reads LLM calls "
                "from its proxy's spans; rewards go to calls by GRPOConfig.credit"
            )
        self.agent_match = agent_match


class TraceToMessages:
    """``agentlightning.TraceToMessages``, accepted with ``APO``: AgentGrad's APO renders each
    rollout's calls, rewards and messages for its critic itself."""


def _adapter(adapter: Any) -> TracerTraceToTriplet | TraceToMessages:
    if adapter is None:
        return TracerTraceToTriplet()
    if isinstance(adapter, (TracerTraceToTriplet, TraceToMessages)):
        return adapter
    if isinstance(adapter, Mapping):
        settings = {k: v for k, v in adapter.items() if k != "type"}
        if adapter.get("type") not in (None, "agentlightning.TracerTraceToTriplet", "TracerTraceToTriplet"):
            raise UnsupportedError(f"adapter type {adapter['type']!r} is not supported: give {{'agent_match': ...}}")
        try:
            return TracerTraceToTriplet(**settings)
        except TypeError as exc:
            raise UnsupportedError(f"adapter {dict(adapter)!r}: {exc}; AgentGrad's adapter takes agent_match") from None
    raise UnsupportedError(
        f"adapter {adapter!r} is not supported: give {{'agent_match': 'regex'}}, "
        "TracerTraceToTriplet(agent_match=...) or, with APO, TraceToMessages()"
    )


def _refuse(name: str, value: Any, instead: str, default: Any = None) -> None:
    if value != default:
        raise UnsupportedError(f"Trainer({name}=...) is not supported by AgentGrad: {instead}")


class Trainer:
    """``agentlightning.Trainer``: runners serving an agent, and an algorithm (``VERL``, ``APO`` or
    any AgentGrad algorithm) that learns from what they capture."""

    def __init__(
        self,
        *,
        dev: bool = False,
        n_runners: int | None = None,
        max_rollouts: int | None = None,
        initial_resources: Mapping[str, Any] | None = None,
        tracer: Any = None,
        adapter: Any = None,
        store: Store | str | None = None,
        runner: Any = None,
        strategy: Any = None,
        port: int | None = None,
        algorithm: Any = None,
        llm_proxy: Any = None,
        n_workers: int | None = None,
        max_tasks: int | None = None,
        daemon: bool = True,
        triplet_exporter: Any = None,
        hooks: Any = None,
    ) -> None:
        _refuse("dev", dev, "call trainer.dev(agent, dataset)", False)
        _refuse("tracer", tracer, "LLM calls are captured at AgentGrad's proxy and tagged by agentgrad.instrument()")
        _refuse("runner", runner, "AgentGrad's runner is built in; n_runners= sets how many")
        _refuse("strategy", strategy, "runners are a thread (n_runners=1) or processes (n_runners>1) over the store")
        _refuse("port", port, "serve a store with `agentgrad store serve --port N` and pass store='http://…'")
        _refuse("max_rollouts", max_rollouts, "the algorithm decides how many rollouts run")
        _refuse("max_tasks", max_tasks, "the algorithm decides how many rollouts run")
        _refuse("daemon", daemon, "runner processes always stop with the Trainer", True)
        _refuse("hooks", hooks, "subclass agentgrad.Runner or pass runner_options to agentgrad.Trainer")
        if adapter is not None and triplet_exporter is not None:
            raise UnsupportedError("give adapter= or triplet_exporter= (its old name), not both")
        if n_runners is not None and n_workers is not None and n_runners != n_workers:
            raise UnsupportedError(f"n_runners={n_runners} and n_workers={n_workers} (its old name) disagree: give one")
        self.n_runners = n_runners if n_runners is not None else n_workers if n_workers is not None else 1
        self.n_workers = self.n_runners
        self.initial_resources = dict(initial_resources) if initial_resources is not None else None
        self.adapter = _adapter(adapter if adapter is not None else triplet_exporter)
        self.triplet_exporter = self.adapter
        if algorithm is not None and not isinstance(algorithm, (VERL, Algorithm)):
            raise UnsupportedError(
                f"algorithm {algorithm!r} is not supported: use agl.VERL(config), agl.APO(client) "
                "or an AgentGrad algorithm"
            )
        if isinstance(self.adapter, TraceToMessages) and not isinstance(algorithm, APO):
            raise UnsupportedError("TraceToMessages() goes with APO; for training give adapter={'agent_match': ...}")
        self.algorithm = algorithm
        self.llm_proxy = llm_proxy
        self.store: Store = open_store(store) if isinstance(store, str) else store or open_store("memory")

    # ---- public -----------------------------------------------------------------------------------
    def fit(
        self, agent: Any, train_dataset: Sequence[Any] | None = None, *, val_dataset: Sequence[Any] | None = None
    ) -> Any:
        """Train: ``VERL`` runs GRPO on its model; ``APO`` and AgentGrad algorithms run as they are.
        Returns what the algorithm returns (Agent Lightning returns None)."""
        agent = self._agent(agent)
        train, val = list(train_dataset or []), list(val_dataset or [])
        algorithm = self.algorithm
        if algorithm is None:
            raise UnsupportedError(
                "Trainer.fit() needs algorithm=agl.VERL(config) or agl.APO(client); "
                "to run the agent once per task, use trainer.dev(agent, dataset)"
            )
        match = self.adapter.agent_match if isinstance(self.adapter, TracerTraceToTriplet) else None
        match = match or getattr(agent, "trained_agents", None)
        if isinstance(algorithm, VERL):
            return self._fit_verl(algorithm, agent, train, val, match)
        if match and isinstance(algorithm, APO):
            raise UnsupportedError(
                f"agent_match {match!r} does not apply to APO (it optimizes a prompt, reading every "
                "call); remove it (or the agent's trained_agents)"
            )
        trainer = _Trainer(
            self.store,
            algorithm=algorithm,
            proxy=self._proxy(),
            n_runners=self.n_runners,
            llm_resource=self._llm_resource(agent),
        )
        return trainer.fit(agent, train, val, resources=self.initial_resources)

    def dev(
        self, agent: Any, train_dataset: Sequence[Any] | None = None, *, val_dataset: Sequence[Any] | None = None
    ) -> Any:
        """Run every task once (``train_dataset`` in train mode, then ``val_dataset`` in val mode)
        with ``initial_resources`` and print a summary; returns the report (of the last set run)."""
        agent = self._agent(agent)
        runs = [(tasks, mode) for tasks, mode in ((train_dataset, "train"), (val_dataset, "val")) if tasks]
        if not runs:
            raise ValueError("Trainer.dev() needs a dataset: trainer.dev(agent, tasks)")
        report = None
        trainer = _Trainer(
            self.store, proxy=self._proxy(), n_runners=self.n_runners, llm_resource=self._llm_resource(agent)
        )
        for tasks, mode in runs:
            report = trainer.dev(agent, list(tasks), self.initial_resources, mode=mode)  # type: ignore[arg-type]
        return report

    # ---- wiring -----------------------------------------------------------------------------------
    def _agent(self, agent: Any) -> Agent:
        agent = as_agent(agent)
        if hasattr(agent, "set_trainer"):
            agent.set_trainer(self)
        return agent

    @staticmethod
    def _llm_resource(agent: Agent) -> str:
        return agent.llm_resource or MAIN_LLM

    def _proxy(self) -> Any:
        """``llm_proxy``; else None, and AgentGrad's Trainer starts a capture proxy in front of the
        one LLM endpoint of the initial resources (Agent Lightning's ``LLMProxy`` role). Several
        endpoints are refused: every call of the agent would go unrecorded."""
        if self.llm_proxy is not None:
            return self.llm_proxy
        endpoints = {item.endpoint for item in (self.initial_resources or {}).values() if isinstance(item, LLM)}
        if len(endpoints) > 1:
            raise UnsupportedError(
                f"initial_resources name several LLM endpoints {sorted(endpoints)}: AgentGrad "
                "captures calls through one proxy; start agentgrad.LLMProxy yourself and pass it "
                "as llm_proxy="
            )
        return None

    def _fit_verl(self, verl: VERL, agent: Agent, train: list[Any], val: list[Any], match: str | None) -> Any:
        from agentgrad.algorithms.grpo import GRPO
        from agentgrad.algorithms.trackers import make_trackers
        from agentgrad.training.local import LocalPolicy

        if self.llm_proxy is not None:
            raise UnsupportedError("VERL serves its model behind its own capture proxy: remove llm_proxy=")
        extra = dict(self.initial_resources or {})
        llms = sorted(name for name, item in extra.items() if isinstance(item, LLM))
        if llms:
            raise UnsupportedError(
                f"VERL serves the trained model as {MAIN_LLM!r}; remove the LLM resource(s) {llms} "
                "from initial_resources"
            )
        config = verl.grpo_config(len(train), match)
        device = config.train.device if config.train.device != "auto" else _auto_device()
        trackers = make_trackers(verl.trackers, Path(config.output_dir), config.run_id)
        grpo = GRPO(verl.model_dir, config, trackers=trackers)
        with LocalPolicy(verl.model_dir, device=device).serving(self.store) as policy:
            trainer = _Trainer(
                self.store, algorithm=grpo, policy=policy, n_runners=self.n_runners, llm_resource=MAIN_LLM
            )
            return trainer.fit(agent, train, val, resources={**extra, MAIN_LLM: policy.llm()})


def _auto_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
