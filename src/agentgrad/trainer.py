"""Trainer: wires a store, runners and an algorithm together.

``dev()`` runs every task once and prints what happened — the first thing to do with a new
agent. ``fit()`` hands the same running machinery to an algorithm (GRPO, APO, SFT…).

Runners: with ``n_runners=1`` the runner lives in this process (a thread), which works with any
store, including :class:`MemoryStore`. With more, runners are separate processes that open the
store by URL; a store that only lives in this process (memory) is then served to them over HTTP
by an in-process store service.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Console

from agentgrad.agents import Agent, as_agent
from agentgrad.algorithms.base import Algorithm, AlgorithmContext
from agentgrad.algorithms.baseline import Evaluate, EvaluationReport
from agentgrad.runner import Runner, RunnerPool
from agentgrad.store import open_store
from agentgrad.store.protocol import Store
from agentgrad.types import RolloutConfig, RolloutMode

log = logging.getLogger(__name__)


class Trainer:
    """Runs agents against a store, for a dev check or for training.

    Args:
        store: a :class:`Store`, or a URL for :func:`open_store` (default: in-memory).
        n_runners: runner workers; 1 runs in-process, more run as processes.
        concurrency: rollouts in flight per runner (for async agents, or sync ones in threads).
        algorithm: what ``fit()`` runs.
        runner_options: extra keyword arguments for each :class:`Runner`.
        proxy: the capture proxy (a started :class:`~agentgrad.proxy.LLMProxy` or its URL); each
            rollout's ``LLM`` resources then point at it, so every call is recorded.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        n_runners: int = 1,
        concurrency: int = 1,
        algorithm: Algorithm | None = None,
        runner_options: dict[str, Any] | None = None,
        console: Console | None = None,
        proxy: Any = None,
    ) -> None:
        self.store = open_store(store) if isinstance(store, str) else store or open_store("memory")
        self.n_runners = n_runners
        self.concurrency = concurrency
        self.algorithm = algorithm
        self.runner_options = runner_options or {}
        self.console = console or Console()
        self.proxy = proxy

    # ---- public API -----------------------------------------------------------------------------
    def dev(
        self,
        agent: Agent | Callable[..., Any],
        tasks: Sequence[Any],
        resources: dict[str, Any] | None = None,
        *,
        mode: RolloutMode = "train",
        timeout: float | None = None,
        config: RolloutConfig | None = None,
        print_summary: bool = True,
    ) -> EvaluationReport:
        """Run every task once with ``resources`` and print a summary; returns the report."""
        published = self.store.add_resources(resources) if resources is not None else None
        evaluate = Evaluate(mode=mode, timeout=timeout, config=config,
                            resources_id=published.resources_id if published else None)
        context = AlgorithmContext(store=self.store, train_tasks=tasks, val_tasks=tasks, console=self.console)
        with self.running(agent):
            report = evaluate.run(context)
        if print_summary:
            report.print(self.console)
        return report

    def fit(
        self,
        agent: Agent | Callable[..., Any],
        train_tasks: Sequence[Any] = (),
        val_tasks: Sequence[Any] = (),
        resources: dict[str, Any] | None = None,
        **extras: Any,
    ) -> Any:
        """Run the algorithm with runners serving ``agent``; returns what the algorithm returns."""
        if self.algorithm is None:
            raise ValueError("Trainer.fit() needs an algorithm: Trainer(algorithm=GRPO(...)) or use dev()")
        if resources is not None:
            self.store.add_resources(resources)
        context = AlgorithmContext(store=self.store, train_tasks=train_tasks, val_tasks=val_tasks,
                                   initial_resources=resources, console=self.console, extras=extras)
        with self.running(agent):
            return self.algorithm.run(context)

    # ---- runners ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self, agent: Agent | Callable[..., Any]) -> Iterator[None]:
        """Runners serving ``agent`` for the duration of the block."""
        agent = as_agent(agent)
        options = {"concurrency": self.concurrency, **self.runner_options}
        if self.proxy is not None:  # read now: an LLMProxy knows its port only once started
            options.setdefault("llm_proxy_url", self.proxy if isinstance(self.proxy, str) else self.proxy.url)
        if self.n_runners == 1:
            if self.proxy is not None and not isinstance(self.proxy, str):
                options.setdefault("llm_proxy", self.proxy)  # in process: flush it directly
            with _thread_runner(agent, self.store, options):
                yield
            return
        with self._shared_store_url() as url, RunnerPool(agent, url, n_runners=self.n_runners,
                                                         store_token=self._store_token(), **options):
            yield

    def _store_token(self) -> str | None:
        """The bearer token runner processes need to reach a protected store service."""
        from agentgrad.store.client import StoreClient  # lazy: the HTTP client only for pools

        return self.store.token if isinstance(self.store, StoreClient) else None

    @contextlib.contextmanager
    def _shared_store_url(self) -> Iterator[str]:
        url = self.store.shared_url
        if url is not None:
            yield url
            return
        from agentgrad.store.service.server import StoreServer  # lazy: only when serving a private store

        server = StoreServer(self.store)
        try:
            yield server.start()
        finally:
            server.stop()


@contextlib.contextmanager
def _thread_runner(agent: Agent, store: Store, options: dict[str, Any]) -> Iterator[Runner]:
    runner = Runner(agent, store, **options)
    thread = threading.Thread(target=runner.run, name="agentgrad-runner", daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(timeout=runner.grace_seconds + 10)
