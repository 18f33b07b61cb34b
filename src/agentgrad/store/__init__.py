"""Stores: where tasks, attempts, spans and resources live.

``open_store(url)`` turns a URL into a backend, so every CLI command and runner takes the same
``--store`` argument: ``memory``, ``sqlite:///path/to/file.db``, ``postgresql://…`` (with
``?schema=name`` for tables in a schema of their own) or ``http://host:port`` (the store
service; its token comes from ``$AGENTGRAD_STORE_TOKEN``).
"""

from __future__ import annotations

from typing import Any

from agentgrad.store.protocol import RolloutFilter, RolloutRequest, Store

__all__ = ["Store", "RolloutFilter", "RolloutRequest", "open_store", "MemoryStore", "SqliteStore", "TOKEN_ENV"]

#: The store service's bearer token, when none is passed: ``agentgrad store serve`` and every
#: ``StoreClient`` read it, so runners join a protected service without the token on their
#: command line (where ``ps`` would show it) and runner processes inherit it.
TOKEN_ENV = "AGENTGRAD_STORE_TOKEN"


def open_store(url: str, *, watchdog: bool = True, **options: Any) -> Store:
    """Open the store a URL names. Heavy backends are imported only when asked for.

    ``watchdog=False`` opens a local backend without its background watchdog — for processes
    (runners, CLI inspection) that share a store whose owner already runs one.
    """
    if not watchdog and not url.startswith(("http://", "https://")):
        options.setdefault("watchdog_interval", None)
    if url in ("memory", "memory://", ":memory:"):
        from agentgrad.store.memory import MemoryStore

        return MemoryStore(**options)
    if url.startswith("sqlite://"):
        from agentgrad.store.sqlite import SqliteStore

        # sqlite:///abs/path.db → /abs/path.db ; sqlite://rel.db → rel.db
        return SqliteStore(url[len("sqlite://"):] or ":memory:", **options)
    if url.startswith(("postgresql://", "postgres://")):
        from agentgrad.store.postgres import PostgresStore

        return PostgresStore(url, **options)
    if url.startswith(("http://", "https://")):
        from agentgrad.store.client import StoreClient

        return StoreClient(url, **options)
    if url.endswith((".db", ".sqlite", ".sqlite3")):
        from agentgrad.store.sqlite import SqliteStore

        return SqliteStore(url, **options)
    raise ValueError(
        f"unknown store URL {url!r}: use memory, sqlite:///path, postgresql://… or http://host:port"
    )


def __getattr__(name: str) -> Any:
    # Lazy exports keep `import agentgrad.store` cheap.
    if name == "MemoryStore":
        from agentgrad.store.memory import MemoryStore

        return MemoryStore
    if name == "SqliteStore":
        from agentgrad.store.sqlite import SqliteStore

        return SqliteStore
    raise AttributeError(name)
