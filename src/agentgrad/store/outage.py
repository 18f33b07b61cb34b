"""A store seen by a worker that must outlive the store's outages.

A runner talks to its store for hours; the store service restarts, its host reboots, the network
drops for a minute. The HTTP client retries a failed call for a second or two and then raises
:class:`~agentgrad.store.client.StoreUnavailableError`; a runner that let that escape would exit,
and nothing restarts it (issue 22). :class:`PatientStore` wraps any store so each call instead
waits the outage out: it retries with capped exponential backoff and jitter for as long as the
store cannot be reached, logs the outage once when it begins and once when it ends (with its
length), and raises at once every error that retrying cannot fix (a 4xx: bad input, an unknown
id, a forbidden status change).

Retrying a call is safe because store writes are: ids are chosen before sending, spans are
idempotent on their ids, status updates to the status an attempt already has do nothing, and
the client sends every other write with an ``Idempotency-Key``.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from agentgrad.store.protocol import Store, fill_wrapper

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What a store that cannot be reached raises: the client's ``StoreUnavailableError`` (a
#: ``ConnectionError``) once its own retries are spent on refused or reset connections, timeouts
#: and 5xx answers; a transport's ``ConnectionError`` or ``TimeoutError``. Anything else — a 4xx
#: rebuilt as ``InvalidInputError``, ``NotFoundError``…, a bug — is not an outage.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached (see :data:`OUTAGE_ERRORS`)."""
    return isinstance(exc, OUTAGE_ERRORS)


class Backoff:
    """Capped exponential delays with jitter: ``first``, then doubling up to ``cap``, each drawn
    from [½, 1½] of its nominal value (capped again), so workers that lost the store together do
    not all knock on it in the same instant when it comes back."""

    def __init__(self, first: float = 0.25, cap: float = 5.0) -> None:
        if not 0 < first <= cap:
            raise ValueError(f"need 0 < first ≤ cap, got first={first}, cap={cap}")
        self.first, self.cap = first, cap
        self._nominal = first

    def next(self) -> float:
        """The next delay in seconds."""
        delay = min(self.cap, self._nominal * random.uniform(0.5, 1.5))
        self._nominal = min(self.cap, self._nominal * 2)
        return delay

    def reset(self) -> None:
        self._nominal = self.first


class OutageLog:
    """Whether the store is down, said once per outage: a warning when a call first finds it
    unreachable, an info line with the outage's length when a call gets through again. Shared by
    every thread of a worker (a runner's slots, its heartbeats), so N callers log one outage."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time of the first failure of this outage
        self.outages = 0  # outages seen so far (diagnostics and tests)

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, what: str, exc: BaseException) -> None:
        with self._lock:
            if self._since is not None:
                return
            self._since = time.monotonic()
            self.outages += 1
        log.warning(
            "%s: the store cannot be reached (%s: %s: %s); retrying with backoff until it answers",
            self.who,
            what,
            type(exc).__name__,
            exc,
        )

    def answered(self) -> None:
        if self._since is None:  # the usual case, without taking the lock
            return
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            log.info("%s: the store answers again after %.1f s", self.who, time.monotonic() - since)


class PatientStore(Store):
    """``store`` with every call waiting out the store's outages (see the module doc).

    Args:
        store: the store to call (usually a :class:`~agentgrad.store.client.StoreClient`).
        who: names the worker in the outage log lines.
        give_up: asked before each retry; when it returns True the outage error is raised
            instead (a runner that was told to stop and whose grace period is over).
        first_delay, max_delay: the backoff between tries (:class:`Backoff`).

    :meth:`call` retries any function; :meth:`try_once` makes one try and returns None on an
    outage (heartbeats and worker records: the next one is due soon anyway). Every :class:`Store`
    method is :meth:`call` of the wrapped store's method; :attr:`outage` says whether it is down.
    """

    def __init__(
        self,
        store: Store,
        *,
        who: str = "worker",
        give_up: Callable[[], bool] = lambda: False,
        first_delay: float = 0.25,
        max_delay: float = 5.0,
    ) -> None:
        self.inner = store
        self.outage = OutageLog(who)
        self.give_up = give_up
        self.first_delay, self.max_delay = first_delay, max_delay

    def call(self, func: Callable[..., T], *args: Any, give_up: Callable[[], bool] | None = None, **kwargs: Any) -> T:
        """``func(*args, **kwargs)``, retried while it fails with an outage error and neither
        ``give_up`` (default: the store's) nor the store's own ``give_up`` says to stop."""
        backoff = None  # made on the first failure: most calls never need one
        while True:
            try:
                result = func(*args, **kwargs)
            except OUTAGE_ERRORS as exc:
                self.outage.failed(getattr(func, "__name__", "call"), exc)
                if (give_up or self.give_up)():
                    raise
                backoff = backoff or Backoff(self.first_delay, self.max_delay)
                time.sleep(backoff.next())
                continue
            self.outage.answered()
            return result

    def try_once(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``func(*args, **kwargs)``, or None when the store cannot be reached (noted in the log)."""
        try:
            result = func(*args, **kwargs)
        except OUTAGE_ERRORS as exc:
            self.outage.failed(getattr(func, "__name__", "call"), exc)
            return None
        self.outage.answered()
        return result

    @property
    def shared_url(self) -> str | None:
        return self.inner.shared_url

    @property
    def in_process(self) -> bool:
        return self.inner.in_process

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"PatientStore({self.inner!r})"


def _patient(name: str) -> Callable[..., Any]:
    def method(self: PatientStore, *args: Any, **kwargs: Any) -> Any:
        return self.call(getattr(self.inner, name), *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"The wrapped store's ``{name}``, waiting out outages."
    return method


fill_wrapper(PatientStore, _patient)  # type: ignore[type-abstract]  # concrete from here on
