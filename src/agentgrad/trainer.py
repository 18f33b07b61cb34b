"""Trainer: wires a store, runners, a policy and an algorithm together.

``dev()`` runs every task once and prints what happened — the first thing to do with a new
agent. ``fit()`` hands the same running machinery to an algorithm (GRPO, APO, SFT…)::

    with LocalPolicy("path/to/model").serving(store) as policy:
        Trainer(store, algorithm=GRPO(policy.model_dir), policy=policy).fit(my_agent, train, val)

Runners: with ``n_runners=1`` the runner lives in this process (a thread), which works with any
store, including :class:`MemoryStore`. With more, runners are separate processes that open the
store by URL; a store that only lives in this process (memory) is then served to them over HTTP
by an in-process store service. With ``n_runners=0`` none is started here: runner processes
started elsewhere (``agentgrad runner``) serve the store, and ``fit()`` only runs the algorithm.

While the algorithm waits for rollouts, the Trainer looks at its runners every second: one that
died (a runner process's start-method error, a crash, a kill) ends the wait with the reason
(:class:`~agentgrad.runner.RunnerDiedError`) instead of leaving it to wait forever.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Never

from rich.console import Console

from agentgrad.agents import Agent, agent_spec, as_agent
from agentgrad.algorithms.base import Algorithm, AlgorithmContext, run_console
from agentgrad.algorithms.baseline import Evaluate, EvaluationReport
from agentgrad.runner import Runner, RunnerDiedError, RunnerPool, check_not_bootstrapping
from agentgrad.store import open_store
from agentgrad.store.protocol import Store, fill_wrapper
from agentgrad.types import LLM, Rollout, RolloutConfig, RolloutMode

if TYPE_CHECKING:
    from agentgrad.proxy.server import LLMProxy
    from agentgrad.training.local import LocalPolicy

log = logging.getLogger(__name__)

#: Keyword arguments people pass to ``fit()`` from other libraries, and what to use instead.
_FIT_HINTS = {
    "train_dataset": "train_tasks=",
    "train_data": "train_tasks=",
    "dataset": "train_tasks=",
    "tasks": "train_tasks=",
    "train": "train_tasks=",
    "val_dataset": "val_tasks=",
    "val_data": "val_tasks=",
    "eval_dataset": "val_tasks=",
    "eval_tasks": "val_tasks=",
    "validation_tasks": "val_tasks=",
    "test_tasks": "val_tasks=",
    "val": "val_tasks=",
    "engine": "Trainer(policy=LocalPolicy(model_dir)): the algorithm gets the policy (and its engine) as "
    "context.policy",
    "model": "Trainer(policy=LocalPolicy(model_dir))",
    "model_dir": "Trainer(policy=LocalPolicy(model_dir))",
    "policy": "Trainer(policy=…)",
    "algorithm": "Trainer(algorithm=…)",
    "n_runners": "Trainer(n_runners=…)",
    "concurrency": "Trainer(concurrency=…)",
    "proxy": "Trainer(proxy=…)",
    "store": "Trainer(store)",
    "llm": "resources={'llm': LLM(...)}",
    "llm_resource": "Trainer(llm_resource=…)",
}

#: How often a wait for rollouts looks at the runners (seconds).
HEALTH_CHECK_INTERVAL = 1.0


class Trainer:
    """Runs agents against a store, for a dev check or for training.

    Args:
        store: a :class:`Store`, or a URL for :func:`open_store` (default: the store of a started
            ``policy``, else a new in-memory one).
        algorithm: what ``fit()`` runs.
        policy: a :class:`~agentgrad.training.local.LocalPolicy` (engine + model server + capture
            proxy). The runners send the agent's LLM calls through its proxy; ``resources``
            defaults to ``{llm_resource: policy.llm()}``; the algorithm receives it as
            ``context.policy`` (GRPO and SFT publish new weights into its engine). If it is not
            started, ``fit()``/``dev()`` start it on this store and close it when they return.
        n_runners: runner workers: 1 runs in-process (a thread), more run as processes, 0 starts
            none (runners elsewhere serve the store: ``agentgrad runner AGENT --store URL``).
        concurrency: rollouts in flight per runner (for async agents, or sync ones in threads).
        llm_resource: the name under which the policy's LLM resource is published (the name the
            agent's ``llm`` parameter or ``resources[...]`` lookup asks for).
        proxy: the capture proxy when there is no ``policy`` (a started
            :class:`~agentgrad.proxy.LLMProxy` or its URL); each rollout's ``LLM`` resources then
            point at it, so every call is recorded. With neither, ``dev()`` and ``fit()`` start one
            in front of the one LLM endpoint their resources name (``capture``).
        capture: whether ``dev()`` and ``fit()`` without a policy or a proxy start a capture proxy
            in front of their resources' LLM endpoint (when they name one, and one only: for
            several, start :class:`~agentgrad.proxy.LLMProxy` yourself; never with
            ``n_runners=0``, whose runners elsewhere take ``--proxy``). False: the agent calls its
            endpoints directly, and only what it records itself (``instrument()``) is kept.
        runner_options: extra keyword arguments for each :class:`Runner` (timings, hooks).
        console: where progress and summaries are printed.
    """

    def __init__(
        self,
        store: Store | str | None = None,
        *,
        algorithm: Algorithm | None = None,
        policy: LocalPolicy | None = None,
        n_runners: int = 1,
        concurrency: int = 1,
        llm_resource: str = "llm",
        proxy: LLMProxy | str | None = None,
        capture: bool = True,
        runner_options: dict[str, Any] | None = None,
        console: Console | None = None,
    ) -> None:
        if n_runners < 0:
            raise ValueError(f"n_runners must be ≥ 0 (0: runners are started elsewhere), got {n_runners}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be ≥ 1, got {concurrency}")
        if policy is not None and proxy is not None:
            raise ValueError("give the Trainer a policy= (its capture proxy is used) or a proxy=, not both")
        if not llm_resource:
            raise ValueError("llm_resource must be a non-empty name")
        if store is None and policy is not None and policy.started:
            store = policy.store
        self.store: Store = open_store(store) if isinstance(store, str) else store or open_store("memory")
        self.algorithm = algorithm
        self.policy = policy
        self._check_policy_store()
        self.n_runners = n_runners
        self.concurrency = concurrency
        self.llm_resource = llm_resource
        self.proxy = proxy
        self.capture = capture
        self.runner_options = runner_options or {}
        self.console = console or run_console()

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
        run_id: str | None = None,
    ) -> EvaluationReport:
        """Run every task once with ``resources`` and print a summary; returns the report. With
        ``run_id`` it is recorded as an evaluation run (:class:`~agentgrad.algorithms.baseline.Evaluate`)
        that the dashboard lists beside training runs."""
        check_not_bootstrapping("Trainer.dev()")
        _check_tasks("tasks", tasks)
        self._prepare_runner_processes()
        with self._policy_running():
            resources = self._resources(resources)
            published = self.store.add_resources(resources) if resources is not None else None
            evaluate = Evaluate(
                mode=mode,
                timeout=timeout,
                config=config,
                resources_id=published.resources_id if published else None,
                run_id=run_id,
            )
            with self._capturing(resources), self.running(agent) as store:
                context = AlgorithmContext(
                    store=store, train_tasks=tasks, val_tasks=tasks, console=self.console, policy=self.policy
                )
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
        **unexpected: Never,
    ) -> Any:
        """Run the algorithm with runners serving ``agent``; returns what the algorithm returns.

        ``resources`` are published first (default with a policy: ``{llm_resource: policy.llm()}``)
        and reach the algorithm as ``context.initial_resources``.
        """
        if unexpected:
            raise TypeError(_unexpected_keywords(unexpected))
        if self.algorithm is None:
            raise ValueError("Trainer.fit() needs an algorithm: Trainer(algorithm=GRPO(...)) or use dev()")
        check_not_bootstrapping("Trainer.fit()")
        _check_tasks("train_tasks", train_tasks)
        _check_tasks("val_tasks", val_tasks)
        self._prepare_runner_processes()
        with self._policy_running():
            resources = self._resources(resources)
            if resources is not None:
                self.store.add_resources(resources)
            with self._capturing(resources), self.running(agent) as store:
                context = AlgorithmContext(
                    store=store,
                    train_tasks=train_tasks,
                    val_tasks=val_tasks,
                    initial_resources=resources,
                    console=self.console,
                    policy=self.policy,
                )
                return self.algorithm.run(context)

    def _prepare_runner_processes(self) -> None:
        """Start what runner processes fork from while the policy loads (:meth:`RunnerPool.prepare`)."""
        if self.n_runners > 1:
            RunnerPool.prepare()

    # ---- the policy -------------------------------------------------------------------------------
    def _check_policy_store(self) -> None:
        policy = self.policy
        if policy is not None and policy.started and policy.store is not self.store:
            raise ValueError(
                "the policy is started on another store than the Trainer's: its proxy would record "
                "the LLM calls where the Trainer cannot see them; give the Trainer the policy's store "
                "(Trainer(policy.store, …) or no store at all)"
            )

    @contextlib.contextmanager
    def _policy_running(self) -> Iterator[None]:
        """The policy started on this store for the block (closed after, if started here)."""
        policy = self.policy
        if policy is None or policy.started:
            self._check_policy_store()
            yield
            return
        with self.console.status(f"starting the local policy {policy.model_dir}…"):
            policy.start(self.store)
        try:
            yield
        finally:
            policy.close()

    def _resources(self, resources: dict[str, Any] | None) -> dict[str, Any] | None:
        if resources is None and self.policy is not None:
            return {self.llm_resource: self.policy.llm()}
        return resources

    @contextlib.contextmanager
    def _capturing(self, resources: dict[str, Any] | None) -> Iterator[None]:
        """With neither a policy nor a proxy: a capture proxy in front of the one LLM endpoint of
        ``resources`` for the block (the runners send the agent's calls through it, so they are
        recorded, with token ids where the server returns them). Not for runners elsewhere
        (``n_runners=0``): they could not reach a proxy on this machine's loopback."""
        if not self.capture or self.policy is not None or self.proxy is not None or self.n_runners == 0:
            yield
            return
        endpoints = {item.endpoint for item in (resources or {}).values() if isinstance(item, LLM)}
        if len(endpoints) > 1:
            log.warning(
                "the resources name several LLM endpoints %s: their calls are not captured; start "
                "agentgrad.LLMProxy(store, endpoint) in front of the one to train and pass it as proxy=",
                sorted(endpoints),
            )
        endpoint = endpoints.pop() if len(endpoints) == 1 else ""
        if not endpoint.startswith(("http://", "https://")):  # none, several, or not a URL to relay to
            yield
            return
        from agentgrad.proxy.server import LLMProxy  # lazy: the proxy's server dependencies

        with LLMProxy(self.store, endpoint) as self.proxy:
            try:
                yield
            finally:
                self.proxy = None

    def _proxy(self) -> tuple[Any, str | None]:
        """The capture proxy the runners use (object or URL) and its URL."""
        proxy: Any = self.proxy
        if proxy is None and self.policy is not None and self.policy.started:
            proxy = self.policy.proxy
        if proxy is None:
            return None, None
        return proxy, proxy if isinstance(proxy, str) else proxy.url  # read now: known once started

    # ---- runners ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self, agent: Agent | Callable[..., Any]) -> Iterator[Store]:
        """Runners serving ``agent`` for the duration of the block.

        Yields the store to wait on: this Trainer's store, except that a wait for rollouts looks at
        the runners every second and raises :class:`~agentgrad.runner.RunnerDiedError` (with the
        reason) once one has died.
        """
        agent = as_agent(agent)
        options = {"concurrency": self.concurrency, **self.runner_options}
        proxy, proxy_url = self._proxy()
        if proxy_url is not None:
            options.setdefault("llm_proxy_url", proxy_url)
        if self.n_runners == 0:
            self._announce_external_runners(agent, proxy_url)
            yield self.store
            return
        if self.n_runners == 1:
            if proxy is not None and not isinstance(proxy, str):
                options.setdefault("llm_proxy", proxy)  # in process: flush it directly
            with _thread_runner(agent, self.store, options) as runner:
                yield _WatchedStore(self.store, runner.check)  # type: ignore[abstract]  # fill_wrapper below
            return
        with (
            self._shared_store_url() as url,
            RunnerPool(agent, url, n_runners=self.n_runners, store_token=self._store_token(), **options) as pool,
        ):
            yield _WatchedStore(self.store, pool.check)  # type: ignore[abstract]  # fill_wrapper below

    def _announce_external_runners(self, agent: Agent, proxy_url: str | None) -> None:
        url = self.store.shared_url or "URL"
        spec = agent_spec(agent) or "MODULE:AGENT"
        command = f"agentgrad runner {spec} --store {url}" + (f" --proxy {proxy_url}" if proxy_url else "")
        if proxy_url and self.llm_resource != "llm":
            command += f" --llm-resource {self.llm_resource}"
        self.console.print(
            f"[dim]n_runners=0: no runner started here; runners started elsewhere serve the agent {agent.name!r}:[/]"
        )
        self.console.print(f"  {command}", markup=False, highlight=False, soft_wrap=True)  # one line to copy

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


class _ThreadRunner:
    """The in-process runner: a :class:`Runner` on a daemon thread, whose death :meth:`check` reports."""

    def __init__(self, agent: Agent, store: Store, options: dict[str, Any]) -> None:
        self.runner = Runner(agent, store, **options)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="agentgrad-runner", daemon=True)

    def _run(self) -> None:
        try:
            self.runner.run()
        except BaseException as exc:
            self.error = exc
            log.exception("the in-process runner %s stopped on an error", self.runner.worker_id)

    def check(self) -> None:
        if self.error is not None:
            raise RunnerDiedError(
                f"the in-process runner {self.runner.worker_id} stopped on {type(self.error).__name__}: {self.error}"
            ) from self.error


@contextlib.contextmanager
def _thread_runner(agent: Agent, store: Store, options: dict[str, Any]) -> Iterator[_ThreadRunner]:
    runner = _ThreadRunner(agent, store, options)
    runner.thread.start()
    try:
        yield runner
    finally:
        runner.runner.stop()
        runner.thread.join(timeout=runner.runner.grace_seconds + 10)


class _WatchedStore(Store):
    """The Trainer's store as its algorithm sees it: every call goes to the store, except that
    :meth:`wait_for_rollouts` waits in slices of :data:`HEALTH_CHECK_INTERVAL` and calls the
    runners' health check between them — so every algorithm, built in or not, learns of a dead
    runner within seconds, and none needs to know that runners exist."""

    def __init__(self, store: Store, check: Callable[[], None], interval: float = HEALTH_CHECK_INTERVAL) -> None:
        self.inner = store
        self.check = check
        self.interval = interval

    def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout: float | None = None) -> list[Rollout]:
        ids = list(rollout_ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        self.check()
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = self.interval if remaining is None else min(self.interval, remaining)
            done = self.inner.wait_for_rollouts(ids, step)
            if len(done) >= len(ids):
                return done
            self.check()
            if deadline is not None and time.monotonic() >= deadline:
                return done

    @property
    def shared_url(self) -> str | None:
        return self.inner.shared_url

    @property
    def in_process(self) -> bool:
        return self.inner.in_process

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # what a backend adds (a client's token, a file's path…)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"watched({self.inner!r})"


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: _WatchedStore, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


fill_wrapper(_WatchedStore, _delegate)  # type: ignore[type-abstract]  # every store method, the backend's own version


def _unexpected_keywords(given: dict[str, Any]) -> str:
    parts = []
    for name in given:
        hint = _FIT_HINTS.get(name)
        parts.append(f"{name!r} (use {hint} instead)" if hint else repr(name))
    return (
        f"Trainer.fit() got unexpected keyword argument(s) {', '.join(parts)}; it takes "
        "fit(agent, train_tasks=(), val_tasks=(), resources=None)"
    )


def _check_tasks(name: str, tasks: Any) -> None:
    if isinstance(tasks, (str, bytes, Path)):
        raise TypeError(
            f"{name} is {type(tasks).__name__} {str(tasks)[:80]!r}, not a sequence of tasks: read a "
            "task file with agentgrad.read_tasks(path)"
        )
