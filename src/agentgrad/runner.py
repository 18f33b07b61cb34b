"""Runners: take rollouts from the store, run the agent, report the outcome.

A :class:`Runner` is one worker loop with ``concurrency`` rollouts in flight (async agents run
concurrently on its event loop; sync agents run in threads). A :class:`RunnerPool` starts
``n_runners`` such workers as separate processes that open the store by URL.

Failure model:
* an agent exception fails the attempt with its type, message and traceback;
* a non-numeric reward fails that rollout with a message, never the runner;
* an attempt goes from ``preparing`` to ``running`` with its first span (the store's rule), or
  when its agent has run ``START_AFTER_SECONDS`` without one: a rollout shorter than that costs
  the store no write for it;
* heartbeats go to the store every ``heartbeat_interval``; if the store says the attempt is over
  (cancelled, timed out), the agent's task is cancelled;
* SIGTERM/SIGINT stop dequeuing, give in-flight rollouts ``grace_seconds`` to finish, then hand
  the rest back as failed attempts (``RunnerStopped``), which the store retries per the rollout's
  ``retry_on``;
* a runner killed outright (SIGKILL) leaves attempts that stop heartbeating: the store's
  watchdog marks them ``unresponsive`` after the rollout's ``unresponsive_seconds`` (30 s by
  default) and retries them;
* a store that cannot be reached (the service restarting, the network down) is waited out: every
  store call goes through a :class:`~agentgrad.store.outage.PatientStore`, which retries with
  capped exponential backoff and jitter for as long as the outage lasts and logs it once (a
  warning) and its end (info, with its length). Dequeuing pauses; heartbeats are skipped; the
  attempt in flight is reported when the store is back (or handed back, if the runner was told to
  stop and its grace ran out first). Errors retrying cannot fix (a 4xx) are raised as before;
* a runner *process* that dies (an error, a signal, or a start that never got as far as the agent:
  the spawn start method and a script without ``if __name__ == "__main__":``) is reported by
  :meth:`RunnerPool.check`, which the ``Trainer`` calls while it waits for rollouts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import json
import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# Imported up front, though a runner only sends through httpx when the store service's URL is
# https or proxied (the store client's transport imports it on first use, from a runner thread): a
# lazy import from one thread while another thread's openai client inspects ``sys.modules['httpx']``
# makes that client fail on a half-imported module.
import httpx  # noqa: F401

from agentgrad.agents import Agent, FunctionAgent, as_agent
from agentgrad.context import RolloutContext, use_context
from agentgrad.emit import reward_span
from agentgrad.errors import AgentGradError, InvalidTransitionError
from agentgrad.http.guard import PROXY_TOKEN_ENV, env_token
from agentgrad.http.tls import share_default_tls_contexts
from agentgrad.http.transport import Transport, env_proxy, transport_for
from agentgrad.http.upstream import Upstream
from agentgrad.proxy.incoming import FLUSH_PATH
from agentgrad.rewards import reward_number
from agentgrad.store.outage import OUTAGE_ERRORS, PatientStore
from agentgrad.store.protocol import RolloutFilter, Store
from agentgrad.types import (
    HEARTBEAT_INTERVAL_SECONDS,
    Attempt,
    AttemptedRollout,
    AttemptError,
    AttemptStatus,
    Resources,
    Span,
    Worker,
    new_id,
    now,
)

log = logging.getLogger(__name__)

#: Seconds an agent runs before the runner marks its attempt ``running`` (if no span did), and
#: the period at which the runner looks at an agent in flight (for a stop, a heartbeat).
START_AFTER_SECONDS = 0.25


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
        raise RewardError(
            f"the agent returned a non-numeric reward {result!r} ({type(result).__name__}): "
            "a reward is a finite int or float, not a bool"
        )
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
            to finish storing its calls — while the attempt's slot runs its next rollout.
        llm_proxy: the in-process proxy object (anything with ``flush(rid, aid, timeout)``, e.g. an
            :class:`~agentgrad.proxy.LLMProxy`); flushed directly instead of over HTTP, and each
            slot finishes an attempt before it claims the next (one GIL: nothing to overlap).
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
        heartbeat_interval: float = HEARTBEAT_INTERVAL_SECONDS,
        grace_seconds: float = 30.0,
        resources_hook: Callable[[Resources, AttemptedRollout], Resources] | None = None,
        llm_proxy_url: str | None = None,
        llm_proxy: Any = None,
        flush_timeout: float = 30.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be ≥ 1, got {concurrency}")
        self.agent = as_agent(agent)
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{new_id('w')[2:8]}"
        # Every store call of the runner and of its agents waits out store outages; retries give
        # up only once the runner was told to stop and its grace period is over.
        # (mypy cannot see PatientStore's Store methods: store/outage.py installs them below the class.)
        self.store = PatientStore(  # type: ignore[abstract]
            store, who=f"runner {self.worker_id}", give_up=self._out_of_grace
        )
        self.concurrency = concurrency
        self.max_rollouts = max_rollouts
        self.poll_timeout = poll_timeout
        self.heartbeat_interval = heartbeat_interval
        self.grace_seconds = grace_seconds
        self.resources_hook = resources_hook
        self.llm_proxy_url = llm_proxy_url
        self.llm_proxy = llm_proxy
        self.flush_timeout = flush_timeout
        self._flush_upstream: Upstream | None = None  # the event loop's client for flushes over HTTP
        self._flush_transport: Transport | None = None  # httpx's, where the environment names a proxy
        self.stats = RunnerStats()
        self._stopping = threading.Event()
        self._stop_deadline = float("inf")  # time.monotonic() when a stop's grace period runs out
        self._claimed = 0
        self._in_flight: dict[str, AttemptedRollout] = {}
        self._last_report = 0.0
        self._reported: str | None = None  # the status of the last worker record written
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._async_agent = _returns_coroutine(self.agent)
        self._resources: dict[str, Resources] = {}  # snapshots by id: immutable in the store
        self._proxy_recorded: set[str] = set()  # attempts whose flush said the proxy recorded a call

    # ---- control ----------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to stop taking work; in-flight rollouts get ``grace_seconds``."""
        if not self._stopping.is_set():
            self._stop_deadline = time.monotonic() + self.grace_seconds
        self._stopping.set()

    def _out_of_grace(self) -> bool:
        """Stopping, and the grace period is over: store calls stop waiting out an outage."""
        return self._stopping.is_set() and time.monotonic() >= self._stop_deadline

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> RunnerStats:
        """Run until stopped or ``max_rollouts`` attempts are done (blocking)."""
        return asyncio.run(self.run_async())

    async def run_async(self) -> RunnerStats:
        from agentgrad.tracing import instrument  # lazy: only a running runner tags LLM requests

        instrument()
        # Our own threads: each slot may hold one for a sync agent, one for a long-polling dequeue
        # or a heartbeat, and one for its last attempt's report to a store behind a network. The
        # loop's default executor (min(32, cpus + 4) threads) would cap concurrency and could
        # starve heartbeats behind busy sync agents.
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=3 * self.concurrency + 2, thread_name_prefix=f"agentgrad-runner-{self.worker_id}"
        )
        self._report_worker("idle", force=True)
        slots = [asyncio.create_task(self._slot()) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*slots)
        finally:
            self._report_worker("stopped", force=True)
            self._executor.shutdown(wait=False, cancel_futures=True)
            if self._flush_upstream is not None:
                await self._flush_upstream.aclose()
                self._flush_upstream = None
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
        # The last attempt's finish (:meth:`_finish_attempt`: the wait for the proxy to store its
        # LLM calls, then its report) runs while the slot claims and runs the next attempt, unless
        # the proxy is in this process; the slot waits for it once that agent is done, so at most
        # one attempt per slot is finishing.
        finishing: asyncio.Task[None] | None = None
        try:
            while self._take_ticket():
                # The store's calls stay off the loop the slots share, unless it answers in this
                # process (:attr:`Store.in_process`): a call over the network may be slow, but a
                # thread hop costs a GIL hand-off each way, and the thread's Python contends for
                # the GIL with the loop's. So an in-process store is asked on the loop for what is
                # queued now; otherwise — or when nothing is queued — a thread long-polls for a
                # claim and prepares its resources.
                claimed, prepared = self._claim_queued() if self.store.in_process else (None, None)
                if claimed is None:
                    claimed, prepared = await self._to_thread(self._dequeue_and_prepare)
                if claimed is None:
                    self._claimed -= 1  # nothing came: the ticket is not spent
                    if not self._in_flight:
                        self._report_worker("idle")  # at once when it just ran out of work, then as a sign of life
                    continue
                if self.stopping or prepared is None:  # the stop arrived while we long-polled: hand it straight back
                    self._hand_back(claimed)
                    continue
                finish = await self._run_attempt(claimed, prepared)
                if finishing is not None:
                    await finishing
                finishing = finish
                if self.llm_proxy is not None and finishing is not None:
                    # The proxy is in this process: its loop, its span writer and the next agent
                    # would contend for one GIL with the finish, for no overlap (measured: a sync
                    # agent's in-process runner lost a quarter of its rollouts a second).
                    await finishing
                    finishing = None
        finally:
            if finishing is not None:
                await finishing

    def _claim_queued(self) -> tuple[AttemptedRollout | None, Resources | BaseException | None]:
        """:meth:`_dequeue_and_prepare` without waiting: one try at what is queued now, none while
        the store is down (the thread's long poll waits that out)."""
        if self.store.outage.down:
            return None, None
        return self._dequeue_and_prepare(wait=False)

    def _dequeue_and_prepare(
        self, *, wait: bool = True
    ) -> tuple[AttemptedRollout | None, Resources | BaseException | None]:
        """A claim (:meth:`_dequeue`) and, unless the runner is stopping (then the claim is handed
        back), its preparation (:meth:`_prepare`): the resources, or the exception preparing raised."""
        claimed = self._dequeue(wait=wait)
        if claimed is None or self.stopping:
            return claimed, None
        try:
            return claimed, self._prepare(claimed)
        except Exception as exc:  # noqa: BLE001 - raised where the attempt runs, as if prepared there
            return claimed, exc

    def _prepare(self, claimed: AttemptedRollout) -> Resources:
        """The attempt's resources; through store outages. The attempt stays ``preparing`` until
        its first span or :meth:`_supervise`'s start mark."""
        return self._resources_for(claimed)

    def _dequeue(self, *, wait: bool = True) -> AttemptedRollout | None:
        """One long-polling claim; through a store outage until it ends or the runner is told to stop
        (then None: nothing was claimed). Every try carries the same idempotency key, so a claim the
        store made but whose answer was lost (it died before replying) is answered to the retry,
        not left claimed by nobody. Without ``wait``: one try at what is queued now, None on an
        outage — and no key, since no retry follows (a store in this process, where it is made,
        cannot lose an answer it committed): a keyed claim also writes the key's record, which cost
        an SQLite claim a fifth of its CPU (114 → 88 µs, measured in one process)."""
        if not wait:
            return self.store.try_once(self.store.inner.dequeue_rollout, self.worker_id, 0.0)
        key = new_id("claim")
        try:
            return self.store.call(
                self.store.inner.dequeue_rollout,
                self.worker_id,
                self.poll_timeout,
                idempotency_key=key,
                give_up=self._stopping.is_set,
            )
        except OUTAGE_ERRORS:
            return None

    async def _run_attempt(
        self, claimed: AttemptedRollout, prepared: Resources | BaseException
    ) -> asyncio.Task[None] | None:
        """Run the attempt's agent; returns the task that finishes the attempt
        (:meth:`_finish_attempt`), or None when the attempt cannot be reported."""
        rollout, attempt = claimed.rollout, claimed.attempt
        self._in_flight[attempt.attempt_id] = claimed
        self._report_worker("busy", claimed)
        try:
            # Prepared with the claim — in its thread when the store is behind a network: during
            # an outage that waits there, and the loop keeps heartbeating other slots.
            if isinstance(prepared, BaseException):
                raise prepared
            resources = prepared
            context = RolloutContext(
                store=self.store,
                rollout=rollout,
                attempt=attempt,
                agent_name=self.agent.name,
                trace_id=attempt.attempt_id.replace("-", "").ljust(32, "0")[:32],
            )
            with use_context(context):
                abandoned = threading.Event()  # set when the loop stops waiting for the agent
                work = asyncio.ensure_future(self._invoke(claimed, resources, abandoned))
                outcome = await self._supervise(work, claimed, abandoned)
                if isinstance(outcome, OUTAGE_ERRORS) and self.stopping:
                    # The agent failed only because its store call gave up waiting out an outage
                    # when the runner's grace ran out: not the agent's failure, and the store
                    # cannot be told.
                    outcome = _Handback()
                reward = work.result() if outcome is None else None
                return asyncio.ensure_future(self._finish_attempt(claimed, outcome, reward))  # in this context
        except Exception as exc:
            self._not_reported(claimed, exc)
            self._done_with(claimed)
            return None

    async def _finish_attempt(
        self, claimed: AttemptedRollout, outcome: BaseException | None, reward: float | None
    ) -> None:
        """Wait until the proxy has stored every LLM call of the attempt, then report it (a success
        with its reward's span). Behind a URL the proxy is in another process, and the attempt's
        slot runs the next attempt meanwhile (:meth:`_slot`): a slot's time per rollout is then its
        claim's and its agent's, the flush and the report overlapping the next agent (one async
        slot in a runner process: 136 → 162 rollouts/s, overhead per rollout 2.7 → 1.3 ms; across
        a network of 2 ms round trips 46 → 72, in ``bench_rollouts.py``). The reward's span is
        built once the calls are stored (the proxy writes them behind its answers), so it follows
        them in time and in the store's order."""
        try:
            if not isinstance(outcome, (_Superseded, _Handback)):
                await self._flush_llm_calls(claimed)
            span = None if reward is None else reward_span(reward)
        except Exception as exc:
            self._not_reported(claimed, exc)
            self._done_with(claimed)
            return
        report = functools.partial(self._report, claimed, outcome, span)
        if self.store.in_process:
            report()
        else:  # a store behind a network: its outage is waited out in the thread
            await self._to_thread(report)

    def _report(self, claimed: AttemptedRollout, outcome: BaseException | None, reward: Span | None) -> None:
        """:meth:`_finish`, with its store errors logged. Over a store behind a network it runs in
        a thread (:meth:`_finish_attempt`): there a store outage is waited out while the loop
        heartbeats the other slots, until the store is back or the runner's grace runs out."""
        try:
            self._finish(claimed, outcome, reward)
        except Exception as exc:
            self._not_reported(claimed, exc)
        finally:
            self._done_with(claimed)

    def _not_reported(self, claimed: AttemptedRollout, exc: Exception) -> None:
        rollout_id = claimed.rollout.rollout_id
        if isinstance(exc, InvalidTransitionError):  # the store ended the attempt first: a watchdog, a cancel
            log.warning(
                "runner %s: rollout %s attempt %s was ended in the store before the runner could report "
                "it (%s); its result is dropped",
                self.worker_id,
                rollout_id,
                claimed.attempt.attempt_id,
                exc,
            )
        else:  # a store error while reporting: log, keep the runner alive
            log.error("runner %s could not report rollout %s", self.worker_id, rollout_id, exc_info=exc)
        self.stats.errors.append(f"{rollout_id}: {type(exc).__name__}: {exc}")

    def _done_with(self, claimed: AttemptedRollout) -> None:
        self._in_flight.pop(claimed.attempt.attempt_id, None)
        self._proxy_recorded.discard(claimed.attempt.attempt_id)

    async def _invoke(self, claimed: AttemptedRollout, resources: Resources, abandoned: threading.Event) -> Any:
        """The agent's run; returns the reward it returned (None: it returned none), which
        :meth:`_finish_attempt` stores with the attempt's success."""
        # Sync agents run in a thread (the context variable travels with it) so heartbeats and
        # other slots keep going; async agents return a coroutine that runs on this loop.
        if self._async_agent:
            result = await self.agent.run_for(claimed.rollout, resources)
        else:
            result = await self._to_thread(self._run_sync_agent, claimed, resources, abandoned)
            if not isinstance(result, _Awaitable):
                return result
            result = await result.awaitable
        return reward_of(result)

    def _run_sync_agent(self, claimed: AttemptedRollout, resources: Resources, abandoned: threading.Event) -> Any:
        """The agent and its reward, in a thread; no reward once the loop has ``abandoned`` the
        attempt (the store ended it, or the runner's grace ran out), which is not reported as a
        success. An agent that returned an awaitable after all gets it back wrapped, for the loop
        to await."""
        result = self.agent.run_for(claimed.rollout, resources)
        if inspect.isawaitable(result):
            return _Awaitable(result)
        reward = reward_of(result)
        return None if abandoned.is_set() else reward

    async def _supervise(
        self, work: asyncio.Future, claimed: AttemptedRollout, abandoned: threading.Event
    ) -> BaseException | None:
        """Await the agent while heartbeating; returns its exception (None on success).

        An agent still running after ``START_AFTER_SECONDS`` has its attempt marked ``running``
        (which is a heartbeat too), unless a span did that first. Marking it at the claim instead
        cost every rollout a store write — one in four of a runner's then — and the writes of all
        runners and of the capture proxy queue for one lock."""
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        last_beat = now()
        started = False
        grace_deadline: float | None = None
        while True:
            done, _ = await asyncio.wait({work}, timeout=START_AFTER_SECONDS)
            if done:
                return work.exception()
            if self.stopping:
                grace_deadline = grace_deadline or now() + self.grace_seconds
                if now() >= grace_deadline:
                    abandoned.set()  # a sync agent's thread then stores no reward
                    work.cancel()
                    return _Handback()
                continue
            if started and now() - last_beat < self.heartbeat_interval:
                continue
            last_beat = now()
            # One try: during an outage a heartbeat (or the start mark) is skipped, not waited for.
            beat = self._heartbeat if started else self._mark_started
            state = await self._to_thread(beat, rollout_id, attempt_id)
            started = started or state is not None
            if state is not None and state.status.is_terminal:
                log.warning(
                    "attempt %s of %s ended in the store (%s); cancelling the agent",
                    attempt_id,
                    rollout_id,
                    state.status.value,
                )
                abandoned.set()
                work.cancel()
                return _Superseded(state.status.value)

    def _heartbeat(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        """One heartbeat: the attempt as the store has it, or None during an outage."""
        return self.store.try_once(self.store.inner.heartbeat, rollout_id, attempt_id)

    def _mark_started(self, rollout_id: str, attempt_id: str) -> Attempt | None:
        """The attempt marked ``running`` (a no-op once a span did so); a heartbeat when it has
        ended in the store meanwhile, to read how. None during an outage."""
        try:
            return self.store.try_once(self.store.inner.update_attempt, rollout_id, attempt_id, AttemptStatus.RUNNING)
        except InvalidTransitionError:
            return self._heartbeat(rollout_id, attempt_id)

    async def _flush_llm_calls(self, claimed: AttemptedRollout) -> None:
        """Wait until the proxy has stored every LLM call of the attempt, without blocking the loop
        the slots share: an in-process proxy's writer is awaited on the loop (one with only a
        blocking ``flush`` is flushed in a thread, :meth:`_flush_now`), a proxy behind a URL is
        asked on the loop itself (:meth:`_flush_over_http`; in a thread only where the environment
        names an HTTP proxy for its URL). A thread hop there and back cost an
        async runner ~0.3 ms of CPU per rollout with four slots (measured). A failure is logged,
        not fatal; an answer that the proxy recorded a call of the attempt spares :meth:`_finish`
        its store read."""
        if self.llm_proxy is None and not self.llm_proxy_url:
            return
        if self.llm_proxy is not None and not hasattr(self.llm_proxy, "flushed"):
            await self._to_thread(self._flush_now, claimed)
            return
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        try:
            if self.llm_proxy is not None:
                recorded = await self.llm_proxy.flushed(rollout_id, attempt_id, self.flush_timeout)
            else:
                recorded = await self._flush_over_http(rollout_id, attempt_id)
        except Exception as exc:
            self._flush_failed(claimed, exc)
        else:
            self._flushed(claimed, recorded)

    async def _flush_over_http(self, rollout_id: str, attempt_id: str) -> bool:
        """``POST /agentgrad/flush`` for the attempt; whether the proxy says it recorded a call of
        it. Through the loop's lean client, or — where the environment routes the proxy's URL
        through an HTTP proxy (``HTTP_PROXY``; ``NO_PROXY`` honoured) — through httpx in a thread."""
        body, headers = self._flush_request(rollout_id, attempt_id)
        root, wait = self._flush_root(), self.flush_timeout + 10
        if self._flush_transport is None and self._flush_upstream is None and env_proxy(root):
            self._flush_transport = transport_for(root, timeout=wait)
        if self._flush_transport is not None:
            transport = self._flush_transport
            status, answer = await self._to_thread(
                functools.partial(transport.request, "POST", FLUSH_PATH, body, headers=headers, timeout=wait)
            )
            return _flush_answer(status, answer)
        if self._flush_upstream is None:
            self._flush_upstream = Upstream(root, timeout=wait)
        response = await self._flush_upstream.request("POST", FLUSH_PATH, body, headers)
        return _flush_answer(response.status_code, await response.read())

    def _flush_now(self, claimed: AttemptedRollout) -> None:
        """The flush of an in-process proxy that has only a blocking ``flush`` (in a thread); a
        failure is logged, not fatal."""
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        try:
            recorded = self.llm_proxy.flush(rollout_id, attempt_id, self.flush_timeout)
        except Exception as exc:
            self._flush_failed(claimed, exc)
        else:
            self._flushed(claimed, recorded)

    def _flushed(self, claimed: AttemptedRollout, recorded: Any) -> None:
        if recorded is True:  # a duck-typed proxy's flush may return nothing
            self._proxy_recorded.add(claimed.attempt.attempt_id)

    def _flush_failed(self, claimed: AttemptedRollout, exc: Exception) -> None:
        rollout_id = claimed.rollout.rollout_id
        log.warning(
            "rollout %s attempt %s: the LLM proxy could not confirm its calls are stored (%s: %s); "
            "reporting the attempt anyway",
            rollout_id,
            claimed.attempt.attempt_id,
            type(exc).__name__,
            exc,
        )
        self.stats.errors.append(f"{rollout_id}: flush: {type(exc).__name__}: {exc}")

    def _flush_root(self) -> str:
        return self.llm_proxy_url.rstrip("/").removesuffix("/v1")  # type: ignore[union-attr]

    @functools.cached_property
    def _flush_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if token := env_token(PROXY_TOKEN_ENV):  # a proxy started with --token
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _flush_request(self, rollout_id: str, attempt_id: str) -> tuple[bytes, dict[str, str]]:
        """The body and headers of ``POST /agentgrad/flush`` for the attempt."""
        body = json.dumps({"rollout_id": rollout_id, "attempt_id": attempt_id, "timeout": self.flush_timeout})
        return body.encode(), self._flush_headers

    def _finish(self, claimed: AttemptedRollout, outcome: BaseException | None, reward: Span | None = None) -> None:
        """Report the attempt: a success with its reward's span in one store write, a failure
        with the error, a hand-back; nothing when the store ended it first."""
        rollout_id, attempt_id = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        if isinstance(outcome, _Superseded):
            self.stats.failed += 1
            return
        if isinstance(outcome, _Handback):
            self._hand_back(claimed)
            return
        if outcome is None:
            spans = () if reward is None else (reward,)
            self.store.update_attempt(rollout_id, attempt_id, AttemptStatus.SUCCEEDED, spans=spans)
            self.stats.succeeded += 1
            if attempt_id not in self._proxy_recorded:
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
        # The store counts the LLM-call spans of a rollout's latest attempt (``llm_calls``): a
        # count of one row is far cheaper than reading a span back (token ids and all).
        if not self.store.count_rollouts(RolloutFilter(rollout_ids=[rollout_id], no_llm_calls=True)):
            return
        self.stats.no_llm_calls += 1
        if self.stats.no_llm_calls in (1, 10, 100) or self.stats.no_llm_calls % 1000 == 0:
            hint = (
                "is the agent using the LLM endpoint it was given?"
                if self.llm_proxy is not None or self.llm_proxy_url
                else "this runner has no capture proxy, so only calls the agent's own instrumentation "
                "reports are recorded (agentgrad.instrument()); give it one: --proxy URL, or "
                "Trainer(proxy=LLMProxy(store, endpoint))"
            )
            log.warning(
                "rollout %s finished with no captured LLM call (%d so far on this runner): it yields no "
                "training data — %s",
                rollout_id,
                self.stats.no_llm_calls,
                hint,
            )

    def _hand_back(self, claimed: AttemptedRollout) -> None:
        error = AttemptError(type="RunnerStopped", message=f"runner {self.worker_id} stopped before finishing")
        try:
            self.store.update_attempt(
                claimed.rollout.rollout_id, claimed.attempt.attempt_id, AttemptStatus.FAILED, error
            )
        except Exception:
            log.exception("could not hand back rollout %s", claimed.rollout.rollout_id)
        self.stats.handed_back += 1

    def _resources_for(self, claimed: AttemptedRollout) -> Resources:
        rid = claimed.rollout.resources_id
        if rid:  # a snapshot never changes: fetched once per runner, a private copy per attempt
            resources = self._resources.get(rid)
            if resources is None:
                resources = self._resources[rid] = self.store.get_resources(rid)
                while len(self._resources) > _RESOURCES_CACHED:
                    self._resources.pop(next(iter(self._resources)))
            resources = resources.model_copy(deep=True)
        else:
            resources = self.store.get_latest_resources() or Resources(resources_id="none", version=0)
        if self.resources_hook:
            resources = self.resources_hook(resources, claimed)
        if self.llm_proxy_url:
            from agentgrad.proxy.hooks import ProxyResourcesHook

            resources = ProxyResourcesHook(self.llm_proxy_url)(resources, claimed)
        return resources

    def _report_worker(self, status: str, claimed: AttemptedRollout | None = None, *, force: bool = False) -> None:
        """Write the worker record (for the dashboard) when its status changes, and otherwise at
        most once per ``heartbeat_interval``: a busy runner's record then says which rollout it was
        on at most that long ago, instead of costing two store writes per rollout."""
        status = "busy" if self._in_flight else status
        if not force and status == self._reported and now() - self._last_report < self.heartbeat_interval:
            return
        self._last_report = now()
        self._reported = status
        if self.store.outage.down:  # a record for the dashboard is not worth a wait
            return
        try:
            self.store.try_once(
                self.store.inner.update_worker,
                Worker(
                    worker_id=self.worker_id,
                    status=status,  # type: ignore[arg-type]
                    current_rollout_id=claimed.rollout.rollout_id if claimed else None,
                    current_attempt_id=claimed.attempt.attempt_id if claimed else None,
                    metadata={
                        "pid": os.getpid(),
                        "concurrency": self.concurrency,
                        "in_flight": len(self._in_flight),
                        "succeeded": self.stats.succeeded,
                        "failed": self.stats.failed,
                    },
                ),
            )
        except Exception:  # worker records are diagnostics; never fail a rollout over them
            log.debug("could not update worker record", exc_info=True)


def _flush_answer(status: int, answer: bytes) -> bool:
    """Whether the proxy's answer to a flush says it recorded a call of the attempt; raises on an
    error answer."""
    if status != 200:
        raise RuntimeError(f"POST {FLUSH_PATH} answered {status}: {answer[:500].decode('utf-8', 'replace')}")
    return b'"recorded_calls":true' in answer  # the proxy's own fixed answer (an older one has no such field)


class _Handback(Exception):
    """The runner stopped before the agent finished."""


@dataclass
class _Awaitable:
    """What a sync agent's thread returns when the agent returned an awaitable: the loop awaits it."""

    awaitable: Any


#: Resource snapshots a runner keeps by id (the newest few an algorithm publishes).
_RESOURCES_CACHED = 16


def _returns_coroutine(agent: Agent) -> bool:
    """Whether ``agent.run_for`` only makes a coroutine (an async agent), so the loop may call it
    without a thread hop. False when unsure: a thread is always safe."""
    if isinstance(agent, FunctionAgent):
        return inspect.iscoroutinefunction(agent.func)
    cls = type(agent)
    return (
        cls.rollout_async is not Agent.rollout_async
        and inspect.iscoroutinefunction(cls.rollout_async)
        and all(
            getattr(cls, name) is getattr(Agent, name)
            for name in ("run_for", "training_rollout", "validation_rollout", "_dispatch")
        )
    )


class _Superseded(Exception):
    """The store ended the attempt (cancel, timeout) while the agent was still running."""


# ---- process pool -----------------------------------------------------------------------------

#: What to do when a runner process dies while starting: named in every such error.
MAIN_GUARD_HINT = (
    "runner processes start as fresh interpreters (the 'forkserver' start method, or 'spawn'): each "
    "imports the main script again (as __mp_main__) and unpickles the agent by reference. If your script "
    'starts the Trainer at module level, put that code under `if __name__ == "__main__":`; and define the agent '
    "at module level of a module the new process can import."
)


def prepare_runner_process() -> None:
    """What a process that exists to run agents (a pool's runner process, ``agentgrad runner``)
    sets up before its runner starts.

    * The end of a store outage is logged (info) beside its start (a warning), even at the usual
      WARNING level: a warning whose end is never said reads as still true.
    * The HTTP clients its agents build share their thread's default TLS context
      (:mod:`agentgrad.http.tls`): an agent builds its client per rollout, and httpx loaded the CA
      bundle for each."""
    outage_log = logging.getLogger("agentgrad.store.outage")
    if outage_log.getEffectiveLevel() > logging.INFO:
        outage_log.setLevel(logging.INFO)
    share_default_tls_contexts()


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


def _runner_process(
    agent: Agent,
    store_url: str,
    options: dict[str, Any],
    store_token: str | None,
    reports: Any = None,
    index: int = 0,
    environ: dict[str, str] | None = None,
    parent_pid: int | None = None,
) -> None:
    from agentgrad.store import TOKEN_ENV, open_store

    if environ is not None:  # a fork server's child has the server's environment: make it the parent's
        os.environ.clear()
        os.environ.update(environ)
    if reports is not None:
        reports.put(("started", index, ""))
    logging.basicConfig(level=os.environ.get("AGENTGRAD_LOG_LEVEL", "WARNING"))
    prepare_runner_process()
    try:
        if store_token:
            os.environ[TOKEN_ENV] = store_token  # this process's own environment: it is the runner's
        store = open_store(store_url, watchdog=False)
        runner = Runner(agent, store, **options)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: runner.stop())
        if parent_pid is not None:
            threading.Thread(
                target=_stop_when_orphaned, args=(runner, parent_pid), daemon=True, name="agentgrad-parent-watch"
            ).start()
        try:
            runner.run()
        finally:
            store.close()
    except BaseException as exc:  # the parent reports it: stderr may be nobody's
        if reports is not None:
            reports.put(("error", index, "".join(traceback.format_exception(exc)).rstrip()))
        raise


def _stop_when_orphaned(runner: Runner, parent_pid: int, every: float = 1.0) -> None:
    """Stop a pool's runner once the process that started the pool is gone. A trainer killed
    outright (SIGKILL, or a signal it does not handle) cannot stop its daemonic children, and a
    runner left behind would go on claiming rollouts of a run nobody reads. (The parent's pid, not
    ``os.getppid()``: a fork server's child has the server as its parent.)"""
    while not runner.stopping:
        time.sleep(every)
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            log.warning(
                "runner %s: the process that started it (pid %d) is gone; stopping", runner.worker_id, parent_pid
            )
            runner.stop()
            return
        except PermissionError:  # alive, owned by someone else
            continue


#: What a runner process needs of AgentGrad, imported once by the fork server (not the agent's
#: modules, nor the main script: the server never runs user code, so a fork of it is as clean as a
#: spawned interpreter).
PRELOADED = (
    "agentgrad.runner",
    "agentgrad.store.sqlite",
    "agentgrad.store.client",
    "agentgrad.proxy.hooks",
    "agentgrad.tracing.instrument",
)


def start_context() -> multiprocessing.context.SpawnContext | multiprocessing.context.ForkServerContext:
    """How runner processes start: ``forkserver`` with :data:`PRELOADED` imported in the server,
    where the platform has it and a fresh interpreter would import this same AgentGrad (the server
    imports it from its own ``sys.path``, not from entries a script added to ours); else ``spawn``.

    A spawned runner spends ~0.3 s of CPU importing AgentGrad (pydantic models, httpx, asyncio)
    before it can claim anything; four of them on two cores took over a second to be ready
    (issue 24). A fork server pays that once per parent process.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods() or not _fresh_interpreter_imports_this_agentgrad():
        return multiprocessing.get_context("spawn")
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    # Keep what the program asked its fork server to preload, but not the main script (the
    # default): that would run user code in the server, and it is imported by each child anyway.
    asked = [m for m in getattr(forkserver._forkserver, "_preload_modules", []) if m != "__main__"]
    ctx.set_forkserver_preload(asked + [m for m in PRELOADED if m not in asked])  # once the server runs: no-op
    return ctx


@functools.cache
def _fresh_interpreter_imports_this_agentgrad() -> bool:
    """Whether ``python -c 'import agentgrad'``, run as the fork server would be, finds this
    process's AgentGrad (checked once per process: ~30 ms)."""
    import subprocess
    from multiprocessing import spawn, util

    flags = util._args_from_interpreter_flags()  # type: ignore[attr-defined]  # private, so not in typeshed
    command = [spawn.get_executable(), *flags, "-c", "import agentgrad; print(agentgrad.__file__)"]
    try:
        found = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    ours = os.path.join(os.path.dirname(__file__), "__init__.py")  # this module's package, not imported here
    return os.path.realpath(found) == os.path.realpath(ours)


class RunnerPool:
    """``n_runners`` runner processes, each with ``concurrency`` rollouts in flight.

    Processes start as fresh interpreters, safe next to threads and torch: from a fork server
    that has imported what a runner needs of AgentGrad once (:func:`start_context`; a process is
    ready in tens of milliseconds instead of a few hundred), or with the ``spawn`` method where
    there is no fork server. Either way each imports the main script again and has the parent's
    environment. They open the store by URL (``sqlite:///…``, ``postgresql://…`` or the store
    service's ``http://…``; ``store_token`` is its bearer token, passed outside the URL). The agent is
    pickled: define it at module level.

    :meth:`check` is the pool's health: it raises :class:`RunnerDiedError` once a runner
    process has died (a non-zero exit code or a signal), with the reason — the exception it
    raised, or, when it died before running any of our code, the spawn start method's usual
    cause. Whoever waits on the runners' work calls it now and then (``Trainer`` does, between
    slices of every wait for rollouts), so a dead pool fails in seconds instead of never.
    """

    def __init__(
        self,
        agent: Agent | Callable[..., Any],
        store_url: str,
        *,
        n_runners: int = 1,
        store_token: str | None = None,
        **runner_options: Any,
    ) -> None:
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

    @staticmethod
    def prepare() -> threading.Thread:
        """Start the fork server runner processes are forked from, in a background thread, so that a
        pool started later is ready in tens of milliseconds instead of the ~0.4 s the server's own
        start takes (an interpreter importing AgentGrad; a check that it is ours). ``Trainer`` calls
        it before it loads its model, which takes longer. Harmless where there is no fork server
        (``spawn``), and when called again. Returns the thread (the bench and tests join it)."""

        def start_fork_server() -> None:
            try:
                if start_context().get_start_method() == "forkserver":
                    from multiprocessing import forkserver

                    forkserver.ensure_running()  # under the server's own lock: a pool starting meanwhile waits
            except Exception as exc:  # the pool's own start tries again, and says what fails
                log.debug("could not start the runner processes' fork server ahead: %s", exc)

        thread = threading.Thread(target=start_fork_server, name="agentgrad-fork-server-start", daemon=True)
        thread.start()
        return thread

    def start(self) -> RunnerPool:
        ctx = start_context()
        self._reports = ctx.SimpleQueue()
        environ = dict(os.environ)
        for index in range(self.n_runners):
            options = {**self.runner_options}
            options.setdefault("worker_id", f"runner-{index}-{new_id('w')[2:8]}")
            process = ctx.Process(
                target=_runner_process,
                args=(
                    self.agent,
                    self.store_url,
                    options,
                    self.store_token,
                    self._reports,
                    index,
                    environ,
                    os.getpid(),
                ),
                name=f"agentgrad-runner-{index}",
                daemon=True,
            )
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
            return (
                f"{who} exited with code {code} while starting, before it could run the agent (its "
                f"traceback is on stderr): {MAIN_GUARD_HINT}"
            )
        return f"{who} exited with code {code} (its traceback, if any, is on stderr)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every runner (they finish or hand back work), then wait; kill stragglers."""
        for process in self.processes:
            if process.is_alive():
                process.terminate()  # SIGTERM; a process that exits meanwhile is no error (an os.kill was)
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
