"""PostgresStore: the store for many machines, over psycopg 3 and the shared SQL of ``sql.py``.

Concurrency model. Every *writing* call runs its whole transaction under one transaction-scoped
advisory lock (per schema), which is what SQLite's ``BEGIN IMMEDIATE`` gives the SQLite
backend: the read-modify-write sequences of the core (claim, retry, watchdog, span sequence ids,
resource versions) then never interleave, a claim is exclusive across any number of processes
and machines, and no deadlock is possible. Reading calls take no lock and run concurrently. The
claim query also carries ``FOR UPDATE SKIP LOCKED`` (the POSTGRES dialect), so claims stay
exclusive even for a future caller that skipped the advisory lock.

Waiters in this process wake on local changes at once; changes made by other processes are seen
within ``external_poll_interval`` seconds, by one waiter at a time reading the server's snapshot of
committed transactions (``pg_current_snapshot()``) and waking the others when it moved.
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
import zlib
from collections.abc import Callable, Iterator

import psycopg
from psycopg import sql

from agentgrad.errors import StoreFileError
from agentgrad.store.core import StoreTx, TransactionalStore
from agentgrad.store.sql import POSTGRES, SCHEMA_VERSION, RowViews, SqlTx, reads_apart
from agentgrad.types import now

#: The query parameter of a store URL that names the schema (``postgresql://…/db?schema=run7``).
#: It is AgentGrad's, not libpq's: :func:`split_schema` takes it out before connecting.
SCHEMA_PARAMETER = "schema"


def split_schema(url: str) -> tuple[str, str | None]:
    """``postgresql://…?schema=s&sslmode=require`` → (``postgresql://…?sslmode=require``, ``"s"``)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for key, value in query if key == SCHEMA_PARAMETER]
    if not schemas:
        return url, None
    rest = urllib.parse.urlencode([(key, value) for key, value in query if key != SCHEMA_PARAMETER])
    return urllib.parse.urlunsplit(parts._replace(query=rest)), schemas[-1]


class _Pool:
    """A few reusable connections (autocommit; transactions are explicit), at most ``size`` open."""

    def __init__(self, connect: Callable[[], psycopg.Connection], size: int) -> None:
        self._connect = connect
        self._idle: list[psycopg.Connection] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self._slots:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None or conn.closed:
                conn = self._connect()
            try:
                yield conn
            finally:
                reusable = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                with self._lock:
                    if reusable and not self._closed:
                        self._idle.append(conn)
                        conn = None
                if conn is not None:
                    conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


@reads_apart
class PostgresStore(TransactionalStore):
    """A store in a PostgreSQL database (optionally in its own ``schema``, created if missing).

    Args:
        url: a libpq URL, ``postgresql://user@host:5432/db``, optionally with ``?schema=name``.
        schema: keep the tables in this schema instead of the connection's default one (the
            same as the URL's ``schema=``; naming two different ones is an error).
        pool_size: most connections this object opens at once.
        clock: the wall clock of every stamp and watchdog check (see :class:`TransactionalStore`).
    """

    def __init__(
        self,
        url: str,
        *,
        watchdog_interval: float | None = 0.5,
        external_poll_interval: float = 0.05,
        schema: str | None = None,
        pool_size: int = 8,
        connect_timeout: float = 10.0,
        clock: Callable[[], float] = now,
    ) -> None:
        url, named = split_schema(url)
        if named is not None and schema is not None and named != schema:
            raise ValueError(f"the URL names schema {named!r} and the schema argument {schema!r}: name one")
        self.url = url
        self.schema = schema = schema if schema is not None else named
        self._connect_timeout = connect_timeout
        self._lock_key = zlib.crc32(f"agentgrad:{schema or ''}".encode())
        self._local = threading.local()
        self._pool = _Pool(self._connect, pool_size)
        self._views = RowViews()
        self._no_snapshot = False  # the server lacks pg_current_snapshot (see _outside_version)
        try:
            self._setup()
        except BaseException:
            self._pool.close()
            raise
        super().__init__(
            watchdog_interval=watchdog_interval, external_poll_interval=external_poll_interval, clock=clock
        )

    def _connect(self) -> psycopg.Connection:
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=max(1, int(self._connect_timeout)))
        except psycopg.OperationalError as exc:
            raise StoreFileError(f"cannot connect to PostgreSQL at {_redact(self.url)}: {exc}") from None
        if self.schema:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        return conn

    def _setup(self) -> None:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))  # racing creators wait
            if self.schema:
                cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
            self._refuse_foreign(cur)
            for statement in POSTGRES.schema():
                cur.execute(statement)
            cur.execute(
                "INSERT INTO agentgrad_meta (key, value) VALUES ('schema_version', %s) ON CONFLICT DO NOTHING",
                (SCHEMA_VERSION,),
            )

    def _refuse_foreign(self, cur: psycopg.Cursor) -> None:
        """Refuse a schema whose tables belong to something else, touching nothing."""
        cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
        tables = {row[0] for row in cur.fetchall()}
        where = f"schema {self.schema or 'public (default)'} of {_redact(self.url)}"
        if not tables:
            return
        if "agentgrad_meta" not in tables:
            shown = ", ".join(sorted(tables)[:5])
            raise StoreFileError(
                f"{where} holds tables of something else ({shown}); refusing to use it as an "
                "AgentGrad store (pass schema=… to use a schema of its own)"
            )
        cur.execute("SELECT value FROM agentgrad_meta WHERE key = 'schema_version'")
        row = cur.fetchone()
        if row is None or row[0] != SCHEMA_VERSION:
            raise StoreFileError(
                f"{where} has store schema version {row[0] if row else 'none'}, this AgentGrad needs {SCHEMA_VERSION}"
            )

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[StoreTx]:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            if not getattr(self._local, "read_only", False):
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
            yield SqlTx(cur, POSTGRES, self._views)

    def _outside_version(self) -> object | None:
        """The server's snapshot of committed transactions, ``pg_current_snapshot()``: it moves
        whenever a transaction that wrote anything commits — another process's, this store's own
        (those also notify the waiters at once), or one in another database of the server (a look
        too many, never one missed) — and not for a call that only read, or a watchdog sweep that
        found nothing to end. A commit a look after this read does not see was still running when
        it was taken, so its end moves the snapshot. None when the server cannot be reached, or
        has no ``pg_current_snapshot`` (before PostgreSQL 13): then every waiter looks itself."""
        if self._closed.is_set() or self._no_snapshot:
            return None
        try:
            with self._pool.connection() as conn:
                row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
        except psycopg.errors.UndefinedFunction:
            self._no_snapshot = True
            return None
        except (psycopg.Error, StoreFileError):
            return None  # an outage: the waiters' own looks meet it
        return None if row is None else row[0]

    def _close_backend(self) -> None:
        self._pool.close()

    def __repr__(self) -> str:
        return f"PostgresStore({_redact(self.url)!r}, schema={self.schema!r})"

    @property
    def shared_url(self) -> str:
        """The URL, with ``schema=`` added when a schema is set (``open_store`` reads it back)."""
        if self.schema is None:
            return self.url
        return f"{self.url}{'&' if '?' in self.url else '?'}{urllib.parse.urlencode({SCHEMA_PARAMETER: self.schema})}"


def _redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    head, at, tail = url.rpartition("@")
    if not at or ":" not in head.split("//", 1)[-1]:
        return url
    scheme, _, userinfo = head.partition("//")
    return f"{scheme}//{userinfo.split(':', 1)[0]}:***@{tail}"
