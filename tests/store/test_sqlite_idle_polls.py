"""A long poll over an SQLite file that nobody writes looks at the queue once, not every
``external_poll_interval``: between looks it reads SQLite's ``data_version``, which moves only when
a change is committed. A change another process makes (another store object on the same file
stands for it) is still seen within the interval, and one this process makes at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentgrad.errors import StoreFileError
from agentgrad.store.sqlite import SqliteStore


def _counting_looks(store: SqliteStore) -> list[int]:
    looks = [0]
    original = store._claimable

    def counting(replay: Any) -> bool:
        looks[0] += 1
        return original(replay)

    store._claimable = counting  # type: ignore[method-assign]
    return looks


def _claim_in_thread(store: SqliteStore, timeout: float) -> tuple[threading.Thread, list[Any]]:
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


@pytest.fixture
def two_processes(tmp_path: Path) -> Iterator[tuple[SqliteStore, SqliteStore]]:
    """A store that polls every 10 ms, and another store object on its file standing for another
    process."""
    path = tmp_path / "store.db"
    store = SqliteStore(path, watchdog_interval=None, external_poll_interval=0.01)
    other = SqliteStore(path, watchdog_interval=None)
    yield store, other
    other.close()
    store.close()


def test_an_idle_long_poll_looks_again_only_once_another_process_wrote(two_processes) -> None:
    store, other = two_processes
    looks = _counting_looks(store)
    thread, got = _claim_in_thread(store, timeout=30)
    time.sleep(0.5)  # fifty poll intervals in which nobody writes
    assert thread.is_alive() and looks[0] == 1
    other.enqueue_rollout({"q": 1})
    thread.join(10)
    assert not thread.is_alive() and got[0] is not None and got[0].rollout.input == {"q": 1}
    assert looks[0] == 2


def test_an_idle_long_poll_sees_this_process_writes_at_once_and_ends_at_its_deadline(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "store.db", watchdog_interval=None, external_poll_interval=60)
    try:
        thread, got = _claim_in_thread(store, timeout=30)
        time.sleep(0.2)
        store.enqueue_rollout({"q": 2})  # notified in process: not left to a 60 s poll
        thread.join(10)
        assert not thread.is_alive() and got[0].rollout.input == {"q": 2}
        started = time.monotonic()
        assert store.dequeue_rollout("w", timeout=0.3) is None  # nothing queued: back at the deadline
        assert time.monotonic() - started < 30
    finally:
        store.close()


def test_a_long_poll_ends_when_the_store_closes(tmp_path: Path) -> None:
    """Woken by the close, not left to its deadline; its last look says the store is closed."""
    store = SqliteStore(tmp_path / "store.db", watchdog_interval=None, external_poll_interval=0.01)
    thread, got = _claim_in_thread(store, timeout=30)
    time.sleep(0.1)
    store.close()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(got[0], StoreFileError) and "is closed" in str(got[0])


def test_the_watch_passes_on_when_its_waiter_leaves(two_processes) -> None:
    """The first long poll watches for the others; when it ends at its deadline, another takes the
    watch, and a write from another process still wakes it."""
    store, other = two_processes
    looks = _counting_looks(store)
    short, got_short = _claim_in_thread(store, timeout=0.5)
    time.sleep(0.1)  # the short poll is waiting, and watching
    long_, got_long = _claim_in_thread(store, timeout=30)
    short.join(10)
    assert got_short == [None] and long_.is_alive()
    time.sleep(0.3)
    assert looks[0] == 3  # one each, and the short poll's last at its deadline: nobody wrote
    other.enqueue_rollout({"q": 3})
    long_.join(10)
    assert not long_.is_alive() and got_long[0].rollout.input == {"q": 3}
