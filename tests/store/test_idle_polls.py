"""A long poll over a store that nobody writes looks at the queue once, not every
``external_poll_interval``: between looks one waiter reads a number that moves only when a change
is committed (SQLite's ``data_version``, PostgreSQL's snapshot of committed transactions, the Redis
store's version key). A change another process makes (another store object on the same data
stands for it) is still seen within the interval, and one this process makes at once.

PostgreSQL's snapshot moves with a commit anywhere in the server — other tests' schemas too — so
the tests count the moves the waiters saw and check that every look but the first followed one."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from agentgrad.errors import StoreFileError

BACKENDS_THAT_TELL = ["sqlite", "postgres", "redis"]
#: Backends whose number moves only with this store's data (PostgreSQL's moves with the server's).
PRECISE = {"sqlite", "redis"}
POLL = {"watchdog_interval": None, "external_poll_interval": 0.01}


class Looks:
    """Counts a store's looks at its queue, and the moves of the number its waiters watch."""

    def __init__(self, store: Any) -> None:
        self.looks = self.moves = 0
        self._last: object = None
        claimable, version = store._claimable, store._outside_version

        def counting_look(replay: Any) -> bool:
            self.looks += 1
            return claimable(replay)

        def counting_version() -> object | None:
            value = version()
            if value is not None and self._last is not None and value != self._last:
                self.moves += 1
            self._last = value if value is not None else self._last
            return value

        store._claimable, store._outside_version = counting_look, counting_version

    def check(self, kind: str, looks: int, waiters: int = 1) -> None:
        """``looks`` looks, or, where the number moves with others' writes, one more per move for
        each waiter (a move wakes them all)."""
        if kind in PRECISE:
            assert (self.looks, self.moves) == (looks, 0)
        else:
            assert looks <= self.looks <= looks + waiters * self.moves


def _claim_in_thread(store: Any, timeout: float) -> tuple[threading.Thread, list[Any]]:
    """A long-polling claim in a thread; ``got`` receives its answer, or the error it raised."""
    got: list[Any] = []

    def claim() -> None:
        try:
            got.append(store.dequeue_rollout("w", timeout=timeout))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            got.append(exc)

    thread = threading.Thread(target=claim)
    thread.start()
    return thread, got


@pytest.mark.parametrize("backend", BACKENDS_THAT_TELL, indirect=True)
def test_an_idle_long_poll_looks_again_only_once_another_process_wrote(backend) -> None:
    store = backend.new(**POLL)
    other = backend.another()
    looks = Looks(store)
    thread, got = _claim_in_thread(store, timeout=30)
    time.sleep(0.5)  # fifty poll intervals in which nobody writes this store
    assert thread.is_alive()
    looks.check(backend.kind, 1)
    other.enqueue_rollout({"q": 1})
    thread.join(10)
    assert not thread.is_alive() and got[0] is not None and got[0].rollout.input == {"q": 1}
    if backend.kind in PRECISE:
        assert looks.looks == 2


@pytest.mark.parametrize("backend", BACKENDS_THAT_TELL, indirect=True)
def test_an_idle_long_poll_sees_this_process_writes_at_once_and_ends_at_its_deadline(backend) -> None:
    store = backend.new(watchdog_interval=None, external_poll_interval=60)
    thread, got = _claim_in_thread(store, timeout=30)
    time.sleep(0.2)
    store.enqueue_rollout({"q": 2})  # notified in process: not left to a 60 s poll
    thread.join(10)
    assert not thread.is_alive() and got[0].rollout.input == {"q": 2}
    started = time.monotonic()
    assert store.dequeue_rollout("w", timeout=0.3) is None  # nothing queued: back at the deadline
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("backend", BACKENDS_THAT_TELL, indirect=True)
def test_a_long_poll_that_found_nothing_does_not_look_again_at_its_deadline(backend) -> None:
    """Nothing was committed since its look, so a last look would find nothing again; a commit made
    meanwhile (too late for the watcher's interval) is looked for."""
    store = backend.new(watchdog_interval=None, external_poll_interval=60)
    other = backend.another()
    looks = Looks(store)
    assert store.dequeue_rollout("w", timeout=0.2) is None
    looks.check(backend.kind, 1)
    thread, got = _claim_in_thread(store, timeout=0.5)
    time.sleep(0.2)
    other.enqueue_rollout({"q": 4})  # the watcher reads every 60 s: only the deadline's read sees it
    thread.join(10)
    assert not thread.is_alive() and got[0] is not None and got[0].rollout.input == {"q": 4}


@pytest.mark.parametrize("backend", BACKENDS_THAT_TELL, indirect=True)
def test_a_long_poll_ends_when_the_store_closes(backend) -> None:
    """Woken by the close, not left to its deadline; its last look finds nothing, or (SQLite, whose
    connection is gone) says the store is closed."""
    store = backend.new(**POLL)
    thread, got = _claim_in_thread(store, timeout=30)
    time.sleep(0.1)
    backend.close(store)
    thread.join(10)
    assert not thread.is_alive()
    if backend.kind == "sqlite":
        assert isinstance(got[0], StoreFileError) and "is closed" in str(got[0])
    else:
        assert got == [None]


@pytest.mark.parametrize("backend", BACKENDS_THAT_TELL, indirect=True)
def test_the_watch_passes_on_when_its_waiter_leaves(backend) -> None:
    """The first long poll watches for the others; when it ends at its deadline, another takes the
    watch, and a write from another process still wakes it."""
    store = backend.new(**POLL)
    other = backend.another()
    looks = Looks(store)
    short, got_short = _claim_in_thread(store, timeout=0.5)
    time.sleep(0.1)  # the short poll is waiting, and watching
    long_, got_long = _claim_in_thread(store, timeout=30)
    short.join(10)
    assert got_short == [None] and long_.is_alive()
    time.sleep(0.3)
    looks.check(backend.kind, 2, waiters=2)  # one each: nobody wrote, so the short poll's deadline did not look
    other.enqueue_rollout({"q": 3})
    long_.join(10)
    assert not long_.is_alive() and got_long[0].rollout.input == {"q": 3}


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_postgres_without_the_snapshot_function_has_every_waiter_look(backend) -> None:
    """Before PostgreSQL 13 there is no ``pg_current_snapshot``: the server's error is taken once,
    and the waiters look each interval themselves, as they did before."""
    import contextlib

    store = backend.new(**POLL)
    pool_connection = store._pool.connection

    @contextlib.contextmanager
    def old_server() -> Any:
        with pool_connection() as conn:
            execute = conn.execute
            conn.execute = lambda query, *a, **k: execute(query.replace("pg_current_snapshot", "no_such_fn"), *a, **k)
            try:
                yield conn
            finally:
                conn.execute = execute

    store._pool.connection = old_server
    assert store._outside_version() is None and store._no_snapshot
    store._pool.connection = pool_connection
    assert store._outside_version() is None  # not asked again
    looks = Looks(store)
    assert store.dequeue_rollout("w", timeout=0.3) is None
    assert looks.looks >= 10  # every 10 ms, as a backend that cannot tell
