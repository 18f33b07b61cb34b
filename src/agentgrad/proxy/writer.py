"""Write-behind recording of LLM call spans, with a per-attempt flush barrier.

The proxy answers the client without waiting for the store: each completed call's span goes to a
:class:`SpanWriter`, whose single background thread writes whatever has queued up in one
``store.add_spans([...])`` call (N concurrent calls cost one transaction). With a ``linger``
(the CLI's default: 50 ms), a span that arrives alone waits that long for company: back-to-back
calls then share a transaction too, and the writer's work — which competes with serving for the
CPU and the GIL, and whose per-transaction part dominates small batches — is done once per batch
instead of right when the agent's next call arrives (measured: ~0.4 ms of added latency per call
in ``bench/bench_proxy.py``). A flush or a stop cuts the wait short, so no flush waits for it;
but a span becomes visible to readers that do not flush only after it, hence no linger by default.

Correctness rests on the **flush barrier**: :meth:`SpanWriter.flush` waits until every call of an
attempt that the proxy has accepted — including calls still streaming — has been stored (or has
ended without a span, e.g. an upstream error or an aborted stream). The runner calls it (in
process, or through ``POST /agentgrad/flush``) before it reports an attempt, and before it stores
the reward of a value the agent returned (with the attempt's success), so "when an agent
returns, all its calls are stored" holds where it matters.

What the barrier does not give is an order: a span reaches the store (and gets its
``sequence_id``) when this thread writes it, so a reward the agent emits right after a call is
usually stored *before* that call. Readers that need before/after order by the spans' own times
(:mod:`agentgrad.adapters.timeline`), never by ``sequence_id``.

Failures are never silent: transient store errors are retried with backoff, a span that still
cannot be written is counted (``store_errors``), logged, and reported by the attempt's next flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgrad.proxy.metrics import ProxyMetrics
    from agentgrad.store.protocol import Store
    from agentgrad.types import Span

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (rollout_id, attempt_id)

#: Errors that retrying cannot fix (unknown rollout, invalid span): no backoff, isolate and report.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (KeyError, ValueError, TypeError)
_FAILURES_REMEMBERED = 4096
_WAKE = object()  # wakes the writer without a span, to stop


class FlushTimeout(TimeoutError):
    """Calls of the attempt were still in flight or queued when the flush timed out."""


class FlushError(RuntimeError):
    """Spans of the attempt could not be stored (after retries)."""

    def __init__(self, rollout_id: str, attempt_id: str, failed: int, last_error: str | None) -> None:
        self.failed, self.last_error = failed, last_error
        super().__init__(
            f"{failed} LLM call span(s) of rollout {rollout_id} attempt {attempt_id} could not be stored: {last_error}"
        )


@dataclass
class FlushResult:
    """What one flush saw: spans of the attempt that were lost since the previous flush, and
    whether a call of the attempt was recorded (as far as the proxy remembers: a False is not a
    "no", see :data:`~agentgrad.proxy.metrics.ATTEMPTS_REMEMBERED`)."""

    failed: int = 0
    last_error: str | None = None
    recorded_calls: bool = False


class SpanWriter:
    """Per-attempt accounting of accepted calls plus the background thread that stores their spans.

    A call is *accepted* with :meth:`begin` when it arrives, and *settled* by :meth:`submit` (its
    span queued, or written at once with ``sync=True``) or :meth:`cancel` (it produced no span).
    :meth:`flush` waits until an attempt has no unsettled call and nothing queued or being written.
    """

    def __init__(
        self,
        store: Store,
        metrics: ProxyMetrics,
        *,
        max_batch: int = 256,
        linger: float = 0.0,
        retries: int = 4,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
    ) -> None:
        self.store, self.metrics = store, metrics
        self.max_batch, self.linger = max_batch, linger
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._cond = threading.Condition(threading.Lock())
        self._pending: dict[Key, int] = {}  # accepted, not yet stored or dropped
        #: :meth:`flushed` calls waiting, each with the loop its future belongs to.
        self._waiters: dict[Key, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]] = {}
        self._failed: OrderedDict[Key, FlushResult] = OrderedDict()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()  # of the running thread
        self._flushing = 0  # flushes waiting: no lingering meanwhile
        self._hurry = threading.Event()  # ends a linger
        self._start_lock = threading.Lock()

    # ---- the serving side (event loop) ---------------------------------------------------------
    def begin(self, key: Key) -> None:
        with self._cond:
            self._pending[key] = self._pending.get(key, 0) + 1

    def cancel(self, key: Key) -> None:
        """The call ended without a span (error, aborted stream)."""
        self._settle([key])

    def submit(self, key: Key, make_span: Callable[[], Span]) -> None:
        """Queue a span (built on the writer thread, off the client's path)."""
        self._ensure_thread()
        self._queue.put((key, make_span))

    def write_now(self, key: Key, make_span: Callable[[], Span]) -> None:
        """``record_mode="sync"``: build and write one span in the calling thread (raises on failure)."""
        try:
            self.store.add_spans([make_span()])
            self.metrics.store_batches += 1
        except Exception as exc:
            self._record_failure([key], exc)
            raise
        else:
            self.metrics.recorded_calls_of([key])
        finally:
            self._settle([key])

    # ---- the barrier ----------------------------------------------------------------------------
    def pending(self, key: Key | None = None) -> int:
        with self._cond:
            return sum(self._pending.values()) if key is None else self._pending.get(key, 0)

    def flush(self, rollout_id: str, attempt_id: str, timeout: float | None = 30.0) -> FlushResult:
        """Block until every accepted call of the attempt is stored or dropped.

        Raises :class:`FlushTimeout` if calls are still pending after ``timeout`` seconds, and
        :class:`FlushError` if spans of the attempt were lost since the previous flush.
        """
        key = (rollout_id, attempt_id)
        with self._cond:
            if self._pending.get(key):
                self._flushing += 1
                self._hurry.set()  # the writer may be lingering with this attempt's spans
                try:
                    self._cond.wait_for(lambda: not self._pending.get(key), timeout)
                finally:
                    self._flushing -= 1
        return self._flush_result(key, timeout)

    async def flushed(self, rollout_id: str, attempt_id: str, timeout: float | None = 30.0) -> FlushResult:
        """:meth:`flush` for the proxy's event loop: it waits on a future the writer resolves, not
        in a thread of its own. Handing a flush to a thread and back cost the proxy process a
        thread hop each way per attempt, ~0.3 and ~0.2 ms apiece with four runner slots (measured),
        on the loop that serves the calls."""
        key = (rollout_id, attempt_id)
        waiter: asyncio.Future[None] | None = None
        with self._cond:
            if self._pending.get(key):
                loop = asyncio.get_running_loop()
                waiter = loop.create_future()
                self._waiters.setdefault(key, []).append((loop, waiter))
                self._flushing += 1
                self._hurry.set()
        if waiter is not None:
            try:
                await asyncio.wait_for(waiter, timeout)
            except TimeoutError:
                pass  # _flush_result says so
            finally:
                with self._cond:
                    self._flushing -= 1
                    waiting = self._waiters.get(key, [])
                    waiting[:] = [w for w in waiting if w[1] is not waiter]
                    if not waiting:
                        self._waiters.pop(key, None)
        return self._flush_result(key, timeout)

    def _flush_result(self, key: Key, timeout: float | None) -> FlushResult:
        """After a flush's wait: :class:`FlushTimeout` if calls of the attempt are still pending,
        :class:`FlushError` if spans of it were lost since the previous flush."""
        with self._cond:
            if self._pending.get(key):
                raise FlushTimeout(
                    f"{self._pending[key]} LLM call(s) of rollout {key[0]} attempt "
                    f"{key[1]} still in flight or unstored after {timeout} s"
                )
            result = self._failed.pop(key, None)
        if result is not None and result.failed:
            raise FlushError(key[0], key[1], result.failed, result.last_error)
        return FlushResult(recorded_calls=self.metrics.recorded_a_call_of(key))

    def flush_all(self, timeout: float | None = 30.0) -> bool:
        """Wait until nothing at all is pending; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Drain the queue (every queued span is written or counted as failed), then stop the thread."""
        with self._start_lock:
            thread, self._thread, stopping = self._thread, None, self._stopping
        if thread is None:
            return
        stopping.set()
        self._hurry.set()
        self._queue.put(_WAKE)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("span writer did not drain in %.0f s; %d span(s) may be lost", timeout, self.pending())

    # ---- the writer thread ------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._stopping = threading.Event()
                    self._thread = threading.Thread(
                        target=self._run, args=(self._stopping,), name="agentgrad-span-writer", daemon=True
                    )
                    self._thread.start()

    def _run(self, stopping: threading.Event) -> None:
        while not (stopping.is_set() and self._queue.empty()):  # everything queued before a stop is written
            batch = self._collect(stopping)
            if batch:
                self._write(batch)

    def _collect(self, stopping: threading.Event) -> list[tuple[Key, Callable[[], Span]]]:
        """The next batch: what has queued up, once there is something (empty after a bare wake).

        A span that comes alone waits ``linger`` for company, unless a flush waits or a stop is
        asked. It waits on an event, not on the queue, so the spans that come meanwhile are queued
        without waking this thread.
        """
        first = self._queue.get()
        batch = [] if first is _WAKE else [first]
        if batch and self.linger > 0 and self._queue.empty() and not stopping.is_set():
            self._hurry.clear()
            if not self._flushing:  # read after the clear: a flush that started before it is seen here
                self._hurry.wait(self.linger)
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _WAKE:
                batch.append(item)
        return batch

    def _write(self, batch: list[tuple[Key, Callable[[], Span]]]) -> None:
        keys, spans = [], []
        for key, make_span in batch:
            try:
                spans.append(make_span())
                keys.append(key)
            except Exception as exc:  # a bug building one span must not lose the others
                log.exception("could not build the span of an LLM call of rollout %s", key[0])
                self._record_failure([key], exc)
                self._settle([key])
        if not spans:
            return
        try:
            if self._add(spans):
                self.metrics.recorded_calls_of(keys)
                return
            # The batch failed for good (a refused batch stores nothing): isolate the bad span(s).
            if len(spans) > 1:
                for key, span in zip(keys, spans, strict=True):
                    if self._add([span]):
                        self.metrics.recorded_calls_of([key])
                    else:
                        self._record_failure([key], self._last_error)
            else:
                self._record_failure(keys, self._last_error)
        finally:
            self._settle(keys)

    _last_error: BaseException | None = None

    def _add(self, spans: list[Span]) -> bool:
        """One ``add_spans`` transaction, retried with backoff on transient errors."""
        delay = self.backoff
        for attempt in range(self.retries + 1):
            try:
                self.store.add_spans(spans)
                self.metrics.store_batches += 1
                return True
            except Exception as exc:
                self._last_error = exc
                if isinstance(exc, PERMANENT_ERRORS) or attempt == self.retries:
                    return False
                self.metrics.store_retries += 1
                log.debug(
                    "storing %d span(s) failed (%s: %s); retry in %.2f s", len(spans), type(exc).__name__, exc, delay
                )
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff)
        return False

    def _record_failure(self, keys: list[Key], exc: BaseException | None) -> None:
        message = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown error"
        self.metrics.store_errors += len(keys)
        for key in keys:
            log.warning("could not store LLM call of rollout %s attempt %s: %s", key[0], key[1], message)
        with self._cond:
            for key in keys:
                result = self._failed.setdefault(key, FlushResult())
                result.failed += 1
                result.last_error = message
                self._failed.move_to_end(key)
            while len(self._failed) > _FAILURES_REMEMBERED:
                self._failed.popitem(last=False)

    def _settle(self, keys: list[Key]) -> None:
        with self._cond:
            for key in keys:
                left = self._pending.get(key, 0) - 1
                if left > 0:
                    self._pending[key] = left
                else:
                    self._pending.pop(key, None)
                    for loop, waiter in self._waiters.pop(key, ()):
                        with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                            loop.call_soon_threadsafe(_wake, waiter)
            self._cond.notify_all()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # it may have timed out meanwhile
        waiter.set_result(None)
