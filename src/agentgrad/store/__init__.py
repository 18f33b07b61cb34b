"""Stores: where tasks, attempts, spans and resources live.

``open_store(url)`` turns a URL into a backend, so every CLI command and runner takes the same
``--store`` argument: ``memory``, a SQLite file (``runs/store.db``, relative, or
``sqlite:///abs/path/to/file.db``, absolute), ``postgresql://…`` (with
``?schema=name`` for tables in a schema of their own), ``redis://host:6379/0`` (with ``?prefix=name``
for keys of their own) or ``http://host:port`` (the store
service; its token comes from ``$AGENTGRAD_STORE_TOKEN``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.store.client import StoreClient as StoreClient
    from agentgrad.store.memory import MemoryStore as MemoryStore
    from agentgrad.store.postgres import PostgresStore as PostgresStore
    from agentgrad.store.protocol import RolloutFilter as RolloutFilter
    from agentgrad.store.protocol import RolloutRequest as RolloutRequest
    from agentgrad.store.protocol import Store as Store
    from agentgrad.store.redis import RedisStore as RedisStore
    from agentgrad.store.sqlite import SqliteStore as SqliteStore
    from agentgrad.store.wire import TOKEN_ENV as TOKEN_ENV

_EXPORTS = {
    "Store": "agentgrad.store.protocol",
    "RolloutFilter": "agentgrad.store.protocol",
    "RolloutRequest": "agentgrad.store.protocol",
    "MemoryStore": "agentgrad.store.memory",
    "SqliteStore": "agentgrad.store.sqlite",
    "PostgresStore": "agentgrad.store.postgres",
    "RedisStore": "agentgrad.store.redis",
    "StoreClient": "agentgrad.store.client",
    "TOKEN_ENV": "agentgrad.store.wire",
}

__all__ = list(_EXPORTS) + ["open_store", "sqlite_path"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


def open_store(url: str, *, watchdog: bool = True, existing: bool = False, **options: Any) -> Store:
    """Open the store a URL names. Heavy backends are imported only when asked for.

    ``watchdog=False`` opens a local backend without its background watchdog — for processes
    (runners, CLI inspection) that share a store whose owner already runs one. ``existing=True``
    is for commands that only read a store: a SQLite file that is not there is an
    :class:`~agentgrad.errors.InvalidInputError` naming the path it looked for, not a new empty
    store that reads as "0 rollouts" (a mistyped path, or ``sqlite:///`` read as relative).
    """
    if not watchdog and not url.startswith(("http://", "https://")):
        options.setdefault("watchdog_interval", None)
    if url in ("memory", "memory://", ":memory:"):
        from agentgrad.store.memory import MemoryStore

        return MemoryStore(**options)
    if (path := sqlite_path(url)) is not None:
        from agentgrad.store.sqlite import SqliteStore

        if existing and path != ":memory:" and not Path(path).expanduser().is_file():
            from agentgrad.errors import InvalidInputError

            raise InvalidInputError(
                f"no store at {url}: there is no file {Path(path).expanduser().absolute()} "
                "(sqlite:///abs/path.db is absolute; a bare path.db or sqlite://rel.db is relative)"
            )
        return SqliteStore(path, **options)
    if url.startswith(("postgresql://", "postgres://")):
        from agentgrad.store.postgres import PostgresStore

        return PostgresStore(url, **options)
    if url.startswith(("redis://", "rediss://")):
        from agentgrad.store.redis import RedisStore

        return RedisStore(url, **options)
    if url.startswith(("http://", "https://")):
        from agentgrad.store.client import StoreClient

        return StoreClient(url, **options)
    raise ValueError(
        f"unknown store URL {url!r}: use memory, path/to/file.db, postgresql://…, redis://host:6379/0 "
        "or http://host:port"
    )


def sqlite_path(url: str) -> str | None:
    """The file a SQLite store URL names (``:memory:`` for ``sqlite://``); None for other stores.

    ``sqlite:///abs/path.db`` → ``/abs/path.db``; ``sqlite://rel.db`` and a bare ``rel.db``
    (ending in ``.db``, ``.sqlite`` or ``.sqlite3``) → ``rel.db``, from the working directory."""
    if url.startswith("sqlite://"):
        return url[len("sqlite://") :] or ":memory:"
    if url.endswith((".db", ".sqlite", ".sqlite3")) and "://" not in url:
        return url
    return None
