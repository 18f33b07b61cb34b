"""SqliteStore's wait for another process's write lock (``_begin_immediate``): it waits while
the lock is held and writes once it is free, gives up with SQLite's own error after its busy
timeout, and stays usable after giving up. Another connection to the same file stands for the
other process (a runner, the capture proxy)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from agentgrad.store.sqlite import SqliteStore


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    return other


def test_a_write_waits_for_another_writer_and_then_lands(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteStore(path, watchdog_interval=None)
    try:
        other = _hold_write_lock(path)
        done: list[str] = []
        errors: list[BaseException] = []

        def write() -> None:
            try:
                done.append(store.enqueue_rollout({"q": 1}).rollout_id)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and not done  # still waiting: the other connection holds the lock
        other.execute("COMMIT")
        other.close()
        writer.join(10)
        assert not errors and len(done) == 1
        assert store.get_rollout(done[0]).input == {"q": 1}
    finally:
        store.close()


def test_a_write_gives_up_after_the_busy_timeout_and_the_store_stays_usable(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SqliteStore(path, watchdog_interval=None, busy_timeout_seconds=0.2)
    try:
        first = store.enqueue_rollout({"q": 1})
        other = _hold_write_lock(path)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            store.enqueue_rollout({"q": 2})
        assert [r.rollout_id for r in store.query_rollouts()] == [first.rollout_id]  # reads do not wait
        other.execute("ROLLBACK")
        other.close()
        second = store.enqueue_rollout({"q": 3})
        assert {r.rollout_id for r in store.query_rollouts()} == {first.rollout_id, second.rollout_id}
    finally:
        store.close()


def test_a_store_opens_while_another_process_writes(tmp_path: Path) -> None:
    """Opening runs the schema in a write transaction: it waits too, rather than failing."""
    path = tmp_path / "store.db"
    SqliteStore(path, watchdog_interval=None).close()
    other = _hold_write_lock(path)
    opened: list[SqliteStore] = []
    opener = threading.Thread(target=lambda: opened.append(SqliteStore(path, watchdog_interval=None)))
    opener.start()
    opener.join(0.3)
    assert opener.is_alive() and not opened
    other.execute("COMMIT")
    other.close()
    opener.join(10)
    assert len(opened) == 1
    opened[0].close()
