"""Runners: take rollouts from the store, run the agent, report the outcome.

A :class:`Runner` is one worker loop with ``concurrency`` rollouts in flight (async agents run
concurrently on its event loop; sync agents run in threads). A :class:`RunnerPool` starts
``n_runners`` such workers as separate processes that open the store by URL.

Failure model:
* an agent exception fails the attempt with its type, message and traceback;
* a non-numeric reward fails that rollout with a message, never the runner;
* heartbeats go to the store every ``heartbeat_interval``; if the store says the attempt is over
  (cancelled, timed out), the agent's task is cancelled;
* SIGTERM/SIGINT stop dequeuing, give in-flight rollouts ``grace_seconds`` to finish, then hand
  the rest back as failed attempts (``RunnerStopped``), which the store retries per the rollout's
  ``retry_on``;
* a runner killed outright (SIGKILL) leaves attempts that stop heartbeating: the store's
  watchdog marks them ``unresponsive`` and retries them;
* a runner *process* that dies (an error, a signal, or a start that never got as far as the agent:
  the spawn start method and a script without ``if __name__ == "__main__":``) is reported by
  :meth:`RunnerPool.check`, which the ``Trainer`` calls while it waits for rollouts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import json
import logging
import multiprocessing
import os
import signal
import socket
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Imported up front, though the runner only sends through httpx when the proxy's URL is https or
# proxied (the flush transport's fallback imports it on first use, from a runner thread): a lazy
# import from one thread while another thread's openai client inspects ``sys.modules['httpx']``
# makes that client fail on a half-imported module.
import httpx  # noqa: F401

from agentgrad import semconv
from agentgrad.agents import Agent, as_agent
from agentgrad.context import RolloutContext, use_context
from agentgrad.emit import emit_reward
from agentgrad.errors import AgentGradError
from agentgrad.http.transport import Transport, transport_for
from agentgrad.rewards import reward_number
from agentgrad.store.protocol import Store
from agentgrad.types import (
    AttemptedRollout,
    AttemptError,
    AttemptStatus,
    Resources,
    Worker,
    new_id,
    now,
)

log = logging.getLogger(__name__)


class RewardError(TypeError):
    """The agent returned something that is not a reward."""


@dataclass
class RunnerStats:
    succeeded: int = 0
    failed: int = 0
    handed_back: int = 0
    no_llm_calls: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed


def reward_of(result: Any) -> float | None:
    """The reward in an agent's return value: a number, None, or a dict with ``reward``."""
    if isinstance(result, Mapping):
        if "reward" not in result:
            raise RewardError(f"the agent returned a dict without a 'reward' key (keys: {sorted(result)})")
        result = result["reward"]
    if result is None:
        return None
    reward = reward_number(result)
    if reward is None:
        raise RewardError(f"the agent returned a non-numeric reward {result!r} ({type(result).__name__}): "
                          "a reward is a finite int or float, not a bool")
    return reward



class Runner:
    """One worker loop over a store.

    Args:
        agent: an :class:`Agent` or a function (wrapped as with ``@rollout``).
        store: any :class:`Store` (in-process, or a client of the store service).
        concurrency: rollouts in flight at once.
        max_rollouts: stop after this many attempts (None: run until stopped).
        poll_timeout: how long one dequeue long-polls before re-checking for a stop.
        heartbeat_interval: seconds between heartbeats of an in-flight attempt.
        grace_seconds: on stop, how long in-flight rollouts may take to finish.
        resources_hook: optional ``(resources, attempted_rollout) -> resources`` applied per attempt.
        llm_proxy_url: the capture proxy's URL; every ``LLM`` resource an attempt receives then
            points at ``{proxy}/rollout/{rid}/attempt/{aid}/v1`` (after ``resources_hook``), and
            before an attempt is reported the runner asks the proxy (``POST /agentgrad/flush``)
            to finish storing its calls.
        llm_proxy: the in-process proxy object (anything with ``flush(rid, aid, timeout)``, e.g. an
            :class:`~agentgrad.proxy.LLMProxy`); flushed directly instead of over HTTP.
        flush_timeout: how long to wait for the proxy's flush before reporting anyway (logged).
    """

    def __init__(
        self,
        agent: Agent | Callable[..., Any],
        store: Store,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        max_rollouts: int | None = None,
        poll_timeout: float = 0.5,
        heartbeat_interval: float = 5.0,
        grace_seconds: float = 30.0,
        resources_hook: Callable[[Resources, AttemptedRollout], Resources] | None = None,
        llm_proxy_url: str | None = None,
        llm_proxy: Any = None,
        flush_timeout: float = 30.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be ≥ 1, got {concurrency}")
        self.agent = as_agent(agent)
        self.store = store
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{new_id('w')[2:8]}"
        self.concurrency = concurrency
        self.max_rollouts = max_rollouts
        self.poll_timeout = poll_timeout
        self.heartbeat_interval = heartbeat_interval
        self.grace_seconds = grace_seconds
        self.resources_hook = resources_hook
        self.llm_proxy_url = llm_proxy_url
        self.llm_proxy = llm_proxy
        self.flush_timeout = flush_timeout
        self._flush_transport: Transport | None = None
        self._flush_transport_lock = threading.Lock()
        self.stats = RunnerStats()
        self._stopping = threading.Event()
        self._claimed = 0
        self._in_flight: dict[str, AttemptedRollout] = {}
        self._last_report = 0.0
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    # ---- control ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to stop taking work; in-flight rollouts get ``grace_seconds``."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> RunnerStats:
        """Run until stopped or ``max_rollouts`` attempts are done (blocking)."""
        return asyncio.run(self.run_async())

    async def run_async(self) -> RunnerStats:
        from agentgrad.tracing import instrument  # lazy: only a running runner tags LLM requests

        instrument()
        # Our own threads: each slot may hold one for a sync agent and one for a long-polling
        # dequeue or a heartbeat. The loop's default executor (min(32, cpus + 4) threads) would
        # cap concurrency and could starve heartbeats behind busy sync agents.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=2 * self.concurrency + 2, thread_name_prefix=f"agentgrad-runner-{self.worker_id}")
        self._report_worker("idle")
        slots = [asyncio.create_task(self._slot()) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*slots)
        finally:
            self._report_worker("stopped")
            self._executor.shutdown(wait=False, cancel_futures=True)
            if self._flush_transport is not None:
                self._flush_transport.close()
                self._flush_transport = None
        return self.stats

    async def _to_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        """``asyncio.to_thread`` on the runner's own executor (context variables travel along)."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._executor, context.run, func, *args)

    # ---- the loop -------------------------------------------------------------------------------
    def _take_ticket(self) -> bool:
        if self.stopping or (self.max_rollouts is not None and self._claimed >= self.max_rollouts):
            return False
        self._claimed += 1
        return True

    async def _slot(self) -> None:
        while self._take_ticket():
            claimed = await self._to_thread(self.store.dequeue_rollout, self.worker_id, self.poll_timeout)
            if claimed is None:
                self._claimed -= 1  # nothing came: the ticket is not spent
                if not self._in_flight and now() - self._last_report >= self.heartbeat_interval:
                    self._report_worker("idle")  # an idle runner still shows as alive
                continue
            if self.stopping:  # the stop arrived while we long-polled: hand it straight back
                self._hand_back(claimed)
                continue
            await self._run_attempt(claimed)

    async def _run_attempt(self, claimed: AttemptedRollout) -> None:
        rollout, attempt = claimed.rollout, claimed.attempt
        key = attempt.attempt_id
        self._in_flight[key] = claimed
        self._report_worker("busy", claimed)
        try:
            resources = self._resources_for(claimed)
            self.store.update_attempt(rollout.rollout_id, attempt.attempt_id, AttemptStatus.RUNNING)
            context = RolloutContext(
                store=self.store, rollout=rollout, attempt=attempt, agent_name=self.agent.name,
                trace_id=attempt.attempt_id.replace("-", "").ljust(32, "0")[:32],
            )
            with use_context(context):
                work = asyncio.ensure_future(self._invoke(claimed, resources))
                outcome = await self._supervise(work, claimed)
            if not isinstance(outcome, (_Superseded, _Handback)):
                await self._flush_llm_calls(claimed)  # its calls are stored before it is reported
            self._finish(claimed, outcome)
        except Exception as exc:  # a store error while reporting: log, keep the runner alive
            log.exception("runner %s could not report rollout %s", self.worker_id, rollout.rollout_id)
            self.stats.errors.append(f"{rollout.rollout_id}: {type(exc).__name__}: {exc}")
        finally:
            self._in_flight.pop(key, None)
            self._report_worker("idle")

    async def _invoke(self, claimed: AttemptedRollout, resources: Resources) -> Any:
        # Sync agents run in a thread (the context variable travels with it) so heartbeats and
        # other slots keep going; async agents return a coroutine that runs on this loop.
        result = await self._to_thread(self.agent.run_for, claimed.rollout, resources)
        if inspect.isawaitable(result):
            result = await result
        reward = reward_of(result)
        if reward is not None:
            emit_reward(reward)
        return reward

    async def _supervise(self, work: asyncio.Future, claimed: AttemptedRollout) -> BaseException | None:
        """Await the agent while heartbeating; returns its exception (None on success)."""
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        last_beat = now()
        grace_deadline: float | None = None
        while True:
            done, _ = await asyncio.wait({work}, timeout=0.25)
            if done:
                return work.exception()
            if self.stopping:
                grace_deadline = grace_deadline or now() + self.grace_seconds
                if now() >= grace_deadline:
                    work.cancel()
                    return _Handback()
                continue
            if now() - last_beat < self.heartbeat_interval:
                continue
            last_beat = now()
            state = await self._to_thread(self.store.heartbeat, rollout_id, attempt_id)
            if state.status.is_terminal:
                log.warning("attempt %s of %s ended in the store (%s); cancelling the agent",
                            attempt_id, rollout_id, state.status.value)
                work.cancel()
                return _Superseded(state.status.value)

    async def _flush_llm_calls(self, claimed: AttemptedRollout) -> None:
        """Wait until the proxy has stored every LLM call of the attempt; a failure is logged, not fatal."""
        if self.llm_proxy is None and not self.llm_proxy_url:
            return
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        try:
            if self.llm_proxy is not None:
                await self._to_thread(self.llm_proxy.flush, rollout_id, attempt_id, self.flush_timeout)
            else:
                await self._to_thread(self._flush_over_http, rollout_id, attempt_id)
        except Exception as exc:
            log.warning("rollout %s attempt %s: the LLM proxy could not confirm its calls are stored (%s: %s); "
                        "reporting the attempt anyway", rollout_id, attempt_id, type(exc).__name__, exc)
            self.stats.errors.append(f"{rollout_id}: flush: {type(exc).__name__}: {exc}")

    def _flush_over_http(self, rollout_id: str, attempt_id: str) -> None:
        """``POST /agentgrad/flush`` through the package's sync transport, whose one retry (a pooled
        connection the proxy closed while idle) is all a flush needs: it is idempotent anyway."""
        wait = self.flush_timeout + 10
        with self._flush_transport_lock:  # slots flush from several threads at once
            if self._flush_transport is None:
                root = self.llm_proxy_url.rstrip("/").removesuffix("/v1")  # type: ignore[union-attr]
                self._flush_transport = transport_for(root, headers={"Content-Type": "application/json"},
                                                      timeout=wait)
            transport = self._flush_transport
        body = json.dumps({"rollout_id": rollout_id, "attempt_id": attempt_id, "timeout": self.flush_timeout})
        status, answer = transport.request("POST", "/agentgrad/flush", body.encode(), timeout=wait)
        if status != 200:
            raise RuntimeError(f"POST /agentgrad/flush answered {status}: {answer[:500].decode('utf-8', 'replace')}")

    def _finish(self, claimed: AttemptedRollout, outcome: BaseException | None) -> None:
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        if isinstance(outcome, _Superseded):
            self.stats.failed += 1
            return
        if isinstance(outcome, _Handback):
            self._hand_back(claimed)
            return
        if outcome is None:
            self.store.update_attempt(rollout_id, attempt_id, AttemptStatus.SUCCEEDED)
            self.stats.succeeded += 1
            self._warn_if_no_llm_calls(rollout_id)
            return
        error = AttemptError(
            type=type(outcome).__name__,
            message=str(outcome),
            traceback="".join(traceback.format_exception(outcome)),
        )
        log.warning("rollout %s failed: %s: %s", rollout_id, error.type, error.message)
        self.store.update_attempt(rollout_id, attempt_id, AttemptStatus.FAILED, error)
        self.stats.failed += 1

    def _warn_if_no_llm_calls(self, rollout_id: str) -> None:
        if self.store.query_spans(rollout_id, "latest", name=semconv.SPAN_LLM_CALL, limit=1):
            return
        self.stats.no_llm_calls += 1
        if self.stats.no_llm_calls in (1, 10, 100) or self.stats.no_llm_calls % 1000 == 0:
            log.warning(
                "rollout %s finished with no captured LLM call (%d so far on this runner): it yields no "
                "training data — is the agent using the LLM endpoint it was given?",
                rollout_id, self.stats.no_llm_calls,
            )

    def _hand_back(self, claimed: AttemptedRollout) -> None:
        error = AttemptError(type="RunnerStopped", message=f"runner {self.worker_id} stopped before finishing")
        try:
            self.store.update_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id,
                                      AttemptStatus.FAILED, error)
        except Exception:
            log.exception("could not hand back rollout %s", claimed.rollout.rollout_id)
        self.stats.handed_back += 1

    def _resources_for(self, claimed: AttemptedRollout) -> Resources:
        rid = claimed.rollout.resources_id
        resources = self.store.get_resources(rid) if rid else self.store.get_latest_resources()
        resources = resources or Resources(resources_id="none", version=0)
        if self.resources_hook:
            resources = self.resources_hook(resources, claimed)
        if self.llm_proxy_url:
            from agentgrad.proxy.hooks import ProxyResourcesHook

            resources = ProxyResourcesHook(self.llm_proxy_url)(resources, claimed)
        return resources

    def _report_worker(self, status: str, claimed: AttemptedRollout | None = None) -> None:
        self._last_report = now()
        try:
            self.store.update_worker(Worker(
                worker_id=self.worker_id,
                status="busy" if self._in_flight else status,  # type: ignore[arg-type]
                current_rollout_id=claimed.rollout.rollout_id if claimed else None,
                current_attempt_id=claimed.attempt.attempt_id if claimed else None,
                metadata={"pid": os.getpid(), "concurrency": self.concurrency, "in_flight": len(self._in_flight),
                          "succeeded": self.stats.succeeded, "failed": self.stats.failed},
            ))
        except Exception:  # worker records are diagnostics; never fail a rollout over them
            log.debug("could not update worker record", exc_info=True)


class _Handback(Exception):
    """The runner stopped before the agent finished."""


class _Superseded(Exception):
    """The store ended the attempt (cancel, timeout) while the agent was still running."""


# ---- process pool -----------------------------------------------------------------------------

#: What to do when a runner process dies while starting: named in every such error.
MAIN_GUARD_HINT = (
    "runner processes are started with the 'spawn' method: each imports the main script again (as "
    "__mp_main__) and unpickles the agent by reference. If your script starts the Trainer at module "
    "level, put that code under `if __name__ == \"__main__\":`; and define the agent at module level "
    "of a module the new process can import."
)


class RunnerDiedError(AgentGradError, RuntimeError):
    """A runner serving the Trainer died: a process that exited with an error or was killed, or the
    in-process runner's thread (the message says which and why)."""


def check_not_bootstrapping(what: str) -> None:
    """Refuse ``what`` while this process is a spawned child still importing its parent's main script.

    That is where a script without ``if __name__ == "__main__":`` lands: the child would start a
    second trainer (load a model, serve a store) before failing on :mod:`multiprocessing`'s own
    check. Failing first, and saying why, costs the child nothing.
    """
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(f"{what} was called while a runner process imported the main script: {MAIN_GUARD_HINT}")


def _runner_process(agent: Agent, store_url: str, options: dict[str, Any], store_token: str | None,
                    reports: Any = None, index: int = 0) -> None:
    from agentgrad.store import TOKEN_ENV, open_store

    if reports is not None:
        reports.put(("started", index, ""))
    logging.basicConfig(level=os.environ.get("AGENTGRAD_LOG_LEVEL", "WARNING"))
    try:
        if store_token:
            os.environ[TOKEN_ENV] = store_token  # this process's own environment: it is the runner's
        store = open_store(store_url, watchdog=False)
        runner = Runner(agent, store, **options)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: runner.stop())
        try:
            runner.run()
        finally:
            store.close()
    except BaseException as exc:  # the parent reports it: stderr may be nobody's
        if reports is not None:
            reports.put(("error", index, "".join(traceback.format_exception(exc)).rstrip()))
        raise


class RunnerPool:
    """``n_runners`` runner processes, each with ``concurrency`` rollouts in flight.

    Processes are started with the ``spawn`` method (safe next to threads and torch) and open
    the store by URL (``sqlite:///…``, ``postgresql://…`` or the store service's
    ``http://…``; ``store_token`` is its bearer token, passed outside the URL). The agent is
    pickled: define it at module level.

    :meth:`check` is the pool's health: it raises :class:`RunnerDiedError` once a runner
    process has died (a non-zero exit code or a signal), with the reason — the exception it
    raised, or, when it died before running any of our code, the spawn start method's usual
    cause. Whoever waits on the runners' work calls it now and then (``Trainer`` does, between
    slices of every wait for rollouts), so a dead pool fails in seconds instead of never.
    """

    def __init__(self, agent: Agent | Callable[..., Any], store_url: str, *, n_runners: int = 1,
                 store_token: str | None = None, **runner_options: Any) -> None:
        if n_runners < 1:
            raise ValueError(f"n_runners must be ≥ 1, got {n_runners}")
        self.agent = as_agent(agent)
        self.store_url = store_url
        self.store_token = store_token
        self.n_runners = n_runners
        self.runner_options = runner_options
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._reports: Any = None
        self._started: set[int] = set()
        self._errors: dict[int, str] = {}
        self._check_lock = threading.Lock()

    def start(self) -> RunnerPool:
        ctx = multiprocessing.get_context("spawn")
        self._reports = ctx.SimpleQueue()
        for index in range(self.n_runners):
            options = {**self.runner_options}
            options.setdefault("worker_id", f"runner-{index}-{new_id('w')[2:8]}")
            process = ctx.Process(target=_runner_process,
                                  args=(self.agent, self.store_url, options, self.store_token, self._reports, index),
                                  name=f"agentgrad-runner-{index}", daemon=True)
            process.start()
            self.processes.append(process)
        return self

    def check(self) -> None:
        """Raise :class:`RunnerDiedError` if a runner process has died (see the class doc).

        A process that exited with code 0 (it ran its ``max_rollouts``, or was stopped) is not
        dead. Cheap: a non-blocking look at each process and at what they reported.
        """
        with self._check_lock:
            self._read_reports()
            for index, process in enumerate(self.processes):
                code = process.exitcode
                if code:
                    self._read_reports()  # a report written just before the exit
                    raise RunnerDiedError(self._death(index, process, code))

    def _read_reports(self) -> None:
        while self._reports is not None and not self._reports.empty():
            kind, index, text = self._reports.get()
            if kind == "started":
                self._started.add(index)
            else:
                self._errors[index] = text

    def _death(self, index: int, process: multiprocessing.process.BaseProcess, code: int) -> str:
        who = f"runner process {process.name} (pid {process.pid})"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"{who} was killed by {name}"
            return how + (" (out of memory?)" if name == "SIGKILL" else "")
        if index in self._errors:
            last = self._errors[index].splitlines()[-1]
            return f"{who} exited with code {code}: {last}\n{self._errors[index]}"
        if index not in self._started:
            return (f"{who} exited with code {code} while starting, before it could run the agent (its "
                    f"traceback is on stderr): {MAIN_GUARD_HINT}")
        return f"{who} exited with code {code} (its traceback, if any, is on stderr)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every runner (they finish or hand back work), then wait; kill stragglers."""
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.join(timeout)
            if process.is_alive():
                log.warning("runner %s did not stop in %.0f s; killing it", process.name, timeout)
                process.kill()
                process.join(5)
        self.processes.clear()
        if self._reports is not None:
            self._reports.close()
            self._reports = None

    def __enter__(self) -> RunnerPool:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
