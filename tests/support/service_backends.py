"""Openers for the conformance suite's "http" and "postgres" backends (registered in conftest.py).

* http: every ``open`` starts a private :class:`StoreServer` (owning a SqliteStore over the test's
  file, watchdog server-side) and returns a :class:`StoreClient` whose ``close`` also stops that
  server — so "another store" is another service process over the same data, as in production.
* postgres: every test gets its own schema (named from the test's data dir), dropped when the
  test session ends; tests skip when no PostgreSQL answers at ``AGENTGRAD_TEST_PG``.
"""

from __future__ import annotations

import atexit
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

PG_URL = os.environ.get("AGENTGRAD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
_SCHEMA_PREFIX = f"agtest_{os.getpid()}_"
_schemas: set[str] = set()


def _served(store: Any) -> Any:
    from agentgrad.store.client import StoreClient
    from agentgrad.store.service.server import StoreServer

    server = StoreServer(store, owns_store=True)

    class ServedClient(StoreClient):
        def close(self) -> None:
            super().close()
            server.stop()

    return ServedClient(server.start(), retries=2)


def open_http(data_dir: Path, options: dict[str, Any]) -> Any:
    from agentgrad.store.sqlite import SqliteStore

    return _served(SqliteStore(str(data_dir / "store.db"), **options))


def http_child(data_dir: Path) -> str:
    return (
        "from agentgrad.store.client import StoreClient\n"
        "from agentgrad.store.service.server import StoreServer\n"
        "from agentgrad.store.sqlite import SqliteStore\n"
        f"_server = StoreServer(SqliteStore({str(data_dir / 'store.db')!r}, watchdog_interval=None), owns_store=True)\n"
        "store = StoreClient(_server.start())\n"
    )


def pg_schema(data_dir: Path) -> str:
    return _SCHEMA_PREFIX + hashlib.sha1(str(data_dir).encode()).hexdigest()[:12]


def skip_unless_ci(reason: str) -> None:
    """Skip locally, but fail in CI: there the services are started first, so a missing one is
    a broken setup that must not pass silently as a skipped backend."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI=true: .ci/run starts it, so this is a setup error)")
    pytest.skip(reason)


def _pg_available() -> bool:
    import psycopg

    try:
        psycopg.connect(PG_URL, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def open_postgres(data_dir: Path, options: dict[str, Any]) -> Any:
    from agentgrad.store.postgres import PostgresStore

    if not _pg_available():
        skip_unless_ci(f"no PostgreSQL at {PG_URL}")
    schema = pg_schema(data_dir)
    if not _schemas:
        atexit.register(drop_schemas)
    _schemas.add(schema)
    return PostgresStore(PG_URL, schema=schema, **options)


def postgres_child(data_dir: Path) -> str:
    return (
        "from agentgrad.store.postgres import PostgresStore\n"
        f"store = PostgresStore({PG_URL!r}, schema={pg_schema(data_dir)!r}, watchdog_interval=None)\n"
    )


def drop_schemas() -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for schema in sorted(_schemas):
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    _schemas.clear()
