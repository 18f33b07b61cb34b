"""SqliteStore: the embedded default — one file, WAL, durable, shareable by local processes.

Durability: the file is in WAL mode with ``synchronous=NORMAL``; a commit is in the WAL (the
operating system's buffers) before the call returns, so every acknowledged write survives a
process kill. Pass ``synchronous="FULL"`` to also survive power loss, at some cost per write.

Several processes may open the same file (runner pools do): claims run inside ``BEGIN
IMMEDIATE`` transactions, so a rollout is never handed out twice, and waiters re-check every
``external_poll_interval`` seconds for changes other processes made. A write that finds another
process's write under way retries within a tenth of a millisecond (:func:`_begin_immediate`), not
after SQLite's own sleeps of 1, 2, 5, 10… ms.

Reads run apart from writes: every call that only reads (:data:`agentgrad.store.sql.READ_ONLY_CALLS`)
takes a snapshot on a read connection of its own (WAL lets readers and the writer work at once),
without the writer's lock. A long read (a page of a 200,000-span rollout, every metric of a run)
then never holds up the heartbeats and claims of a store service in front of this store. A
private ``":memory:"`` database has one connection, so its reads take the writer's turn.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from agentgrad.errors import StoreFileError
from agentgrad.store.core import StoreTx, TransactionalStore
from agentgrad.store.sql import SCHEMA_VERSION, SQLITE, RowViews, SqlTx, reads_apart
from agentgrad.types import now

_MIN_SQLITE = (3, 35, 0)  # the documented floor (upserts, partial indexes and json_extract need less)
#: A write waiting for another process's write lock tries again after this many seconds, then
#: after twice as long each time, up to :data:`BUSY_PAUSE_MAX` (see :func:`_begin_immediate`).
BUSY_PAUSE_FIRST = 50e-6
BUSY_PAUSE_MAX = 1e-3


@reads_apart
class SqliteStore(TransactionalStore):
    """A store in one SQLite file (``":memory:"`` for a private in-memory database)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        watchdog_interval: float | None = 0.5,
        external_poll_interval: float = 0.05,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout_seconds: float = 30.0,
        clock: Callable[[], float] = now,
    ) -> None:
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise StoreFileError(f"SQLite ≥ 3.35 is required, this Python has {sqlite3.sqlite_version}")
        # ``~`` is expanded once, here: the directory made, the file opened and ``shared_url``
        # must all name the same place.
        self.path = str(path) if str(path) == ":memory:" else str(Path(path).expanduser())
        if self.path != ":memory:":
            Path(self.path).resolve().parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._watch_lock = threading.Lock()
        self._watch: sqlite3.Connection | None = None  # reads data_version (_outside_version)
        self._local = threading.local()
        self._views = RowViews()
        self._busy_timeout = busy_timeout_seconds
        self._conn = self._open(busy_timeout_seconds, synchronous)
        self._readers = None if self.path == ":memory:" else _Readers(self.path, busy_timeout_seconds)
        super().__init__(
            watchdog_interval=watchdog_interval, external_poll_interval=external_poll_interval, clock=clock
        )

    def _open(self, busy_timeout_seconds: float, synchronous: str) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=busy_timeout_seconds)
        try:
            self._refuse_foreign(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            # The writer waits for the write lock in _begin_immediate, not in SQLite's busy
            # handler; once BEGIN IMMEDIATE holds it, nothing in a WAL transaction waits again.
            conn.execute("PRAGMA busy_timeout=0")
            with _immediate(conn, busy_timeout_seconds) as cur:
                for statement in SQLITE.schema():
                    cur.execute(statement)
                cur.execute(
                    "INSERT INTO agentgrad_meta (key, value) VALUES ('schema_version', ?) ON CONFLICT DO NOTHING",
                    (SCHEMA_VERSION,),
                )
        except BaseException:
            conn.close()
            raise
        return conn

    def _refuse_foreign(self, conn: sqlite3.Connection) -> None:
        """Refuse a file that is not SQLite, or an SQLite database that is not ours, untouched."""
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise StoreFileError(
                f"{self.path} is not a usable SQLite store file ({exc}); refusing to open it"
            ) from None
        if not tables:
            return
        if "agentgrad_meta" not in tables:
            shown = ", ".join(sorted(tables)[:5])
            raise StoreFileError(
                f"{self.path} is an SQLite database that belongs to something else (tables: {shown}); "
                "refusing to open it as an AgentGrad store"
            )
        row = conn.execute("SELECT value FROM agentgrad_meta WHERE key = 'schema_version'").fetchone()
        if row is None or row[0] != SCHEMA_VERSION:
            found = row[0] if row else "none"
            raise StoreFileError(f"{self.path} has store schema version {found}, this AgentGrad needs {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[StoreTx]:
        if self._readers is not None and getattr(self._local, "read_only", False):
            with self._readers.snapshot() as cur:
                yield SqlTx(cur, SQLITE, self._views)
        else:
            with self._lock, _immediate(self._conn, self._busy_timeout) as cur:
                yield SqlTx(cur, SQLITE, self._views)

    def _outside_version(self) -> object | None:
        """SQLite's ``data_version`` on a connection that only reads it: it moves with every
        change committed by any other connection — another process's, and this store's writer's
        too (those also notify the waiters at once)."""
        if self._readers is None:
            return None  # a private ":memory:" database: only this store writes it
        with self._watch_lock:  # close() marks the store closed before it closes this connection
            if self._closed.is_set():
                return None
            if self._watch is None:
                self._watch = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            return self._watch.execute("PRAGMA data_version").fetchone()[0]

    def _close_backend(self) -> None:
        if self._readers is not None:
            self._readers.close()
        with self._watch_lock:
            if self._watch is not None:
                self._watch.close()
        with self._lock:
            self._conn.close()

    @property
    def shared_url(self) -> str | None:
        return None if self.path == ":memory:" else "sqlite://" + str(Path(self.path).resolve())

    @property
    def in_process(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"


class _Readers:
    """Connections that only read the store's file, reused across calls and threads.

    Each read is one deferred transaction: a consistent snapshot of what was committed when it
    began, taken without the write lock. At most ``keep`` idle connections are kept (a burst of
    concurrent reads opens more, closed after use).
    """

    def __init__(self, path: str, busy_timeout_seconds: float, keep: int = 8) -> None:
        self._path, self._busy_timeout, self._keep = path, busy_timeout_seconds, keep
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None, timeout=self._busy_timeout)
        conn.execute("PRAGMA query_only=1")
        return conn

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[sqlite3.Cursor]:
        with self._lock:
            if self._closed:
                raise StoreFileError(f"the store {self._path} is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        cur = conn.cursor()
        try:
            cur.execute("BEGIN")
            yield cur
        finally:
            cur.close()
            conn.rollback()  # a read-only transaction: ending it either way is the same
            with self._lock:
                if self._closed or len(self._idle) >= self._keep:
                    conn.close()
                else:
                    self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection, busy_timeout_seconds: float) -> Iterator[sqlite3.Cursor]:
    """A write transaction taken up front, so concurrent processes serialize instead of
    deadlocking on lock upgrades."""
    cur = conn.cursor()
    _begin_immediate(cur, busy_timeout_seconds)
    try:
        yield cur
    except BaseException:
        conn.rollback()
        raise
    else:
        conn.commit()
    finally:
        cur.close()


def _begin_immediate(cur: sqlite3.Cursor, busy_timeout_seconds: float) -> None:
    """``BEGIN IMMEDIATE``, waiting up to ``busy_timeout_seconds`` while another process writes.

    SQLite's busy handler sleeps 1, 2, 5, 10, 15, 20, 25… ms between tries, while a write here
    holds the lock for about a tenth of a millisecond. With a runner and the capture proxy writing
    one file a few hundred times a second, a tenth of the writes waited over 1 ms and one in a
    hundred 3–8 ms (measured, ``bench/bench_rollouts.py``'s four async slots) — on an async
    runner's event loop, a stall of every slot. Tries here follow each other from 50 µs apart,
    doubling to 1 ms."""
    pause, deadline = BUSY_PAUSE_FIRST, None
    while True:
        try:
            cur.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            clock = time.monotonic()
            deadline = deadline or clock + busy_timeout_seconds
            if clock >= deadline:
                raise
            time.sleep(min(pause, deadline - clock))
            pause = min(2 * pause, BUSY_PAUSE_MAX)
