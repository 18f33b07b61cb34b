"""Fixtures of the store conformance suite (``tests/store/test_conformance_*.py``).

Every test in the suite takes the ``store`` fixture (or ``backend``, to open stores itself) and
therefore runs once per backend registered in :data:`BACKENDS`. The tests only use the public
:class:`agentgrad.store.Store` API, so a new backend joins the suite by adding one entry here:

* ``open(data_dir, options) -> Store`` opens a store over *this test's* data. ``data_dir`` is
  the test's private ``tmp_path``; every call within one test must reach the same data for
  durable/shared backends (same SQLite file, same PostgreSQL schema, same server). ``options``
  always holds ``watchdog_interval`` (``None`` = no background watchdog; tests then call
  ``check_watchdog()`` themselves) and may hold ``clock`` (a ``ManualClock`` from
  ``tests/support/manual_clock.py``; the "http" backend hands it to the store behind its
  in-process server).
* capability flags: ``durable`` (data survives ``close()`` + reopen), ``shared`` (several
  ``Store`` objects may serve the same data at once, as separate processes would),
  ``file_based`` (the data is one file at ``backend.path``), ``child_source`` (Python source that
  binds ``store`` in a fresh interpreter over the same data, for the SIGKILL durability test).
* ``module`` and ``requires``: when the backend module or one of its third-party dependencies is
  not installed, its tests are skipped (any other import error fails loudly).

The "http" and "postgres" entries take their openers from ``service_backends.py`` (an HTTP
client over a private store service; a PostgreSQL schema per test, skipped when no server
answers at ``AGENTGRAD_TEST_PG``), the "redis" entry from ``redis_backend.py`` (a key prefix per
test, skipped when no server answers at ``AGENTGRAD_TEST_REDIS``). Run one backend with
``-k memory`` / ``-k sqlite`` / ….
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis_backend  # opener of the "redis" backend
import service_backends  # openers of the "http" and "postgres" backends

from agentgrad.store.protocol import Store
from agentgrad.types import AttemptedRollout, Span

# ---- backend registry ----------------------------------------------------------------------


def _open_memory(data_dir: Path, options: dict[str, Any]) -> Store:
    from agentgrad.store.memory import MemoryStore

    return MemoryStore(**options)


def _sqlite_path(data_dir: Path) -> Path:
    return data_dir / "store.db"


def _open_sqlite(data_dir: Path, options: dict[str, Any]) -> Store:
    from agentgrad.store.sqlite import SqliteStore

    return SqliteStore(str(_sqlite_path(data_dir)), **options)


def _open_sqlite_file(path: Path, options: dict[str, Any]) -> Store:
    from agentgrad.store.sqlite import SqliteStore

    return SqliteStore(str(path), **options)


def _sqlite_child(data_dir: Path) -> str:
    return (
        "from agentgrad.store.sqlite import SqliteStore\n"
        f"store = SqliteStore({str(_sqlite_path(data_dir))!r}, watchdog_interval=None)\n"
    )


@dataclass(frozen=True)
class BackendSpec:
    kind: str
    module: str
    open: Callable[[Path, dict[str, Any]], Store]
    durable: bool = False
    shared: bool = False
    file_based: bool = False
    open_file: Callable[[Path, dict[str, Any]], Store] | None = None
    data_path: Callable[[Path], Path] | None = None
    child_source: Callable[[Path], str] | None = None
    requires: tuple[str, ...] = ()


BACKENDS: dict[str, BackendSpec] = {
    "memory": BackendSpec("memory", "agentgrad.store.memory", _open_memory),
    "sqlite": BackendSpec(
        "sqlite",
        "agentgrad.store.sqlite",
        _open_sqlite,
        durable=True,
        shared=True,
        file_based=True,
        open_file=_open_sqlite_file,
        data_path=_sqlite_path,
        child_source=_sqlite_child,
    ),
    "http": BackendSpec(
        "http",
        "agentgrad.store.client",
        service_backends.open_http,
        durable=True,
        shared=True,
        child_source=service_backends.http_child,
        requires=("fastapi", "uvicorn"),
    ),
    "postgres": BackendSpec(
        "postgres",
        "agentgrad.store.postgres",
        service_backends.open_postgres,
        durable=True,
        shared=True,
        child_source=service_backends.postgres_child,
        requires=("psycopg",),
    ),
    "redis": BackendSpec(
        "redis",
        "agentgrad.store.redis",
        redis_backend.open_redis,
        durable=True,
        shared=True,
        child_source=redis_backend.redis_child,
        requires=("redis",),
    ),
}


DEFAULT_OPTIONS: dict[str, Any] = {"watchdog_interval": None}


class StoreBackend:
    """One backend bound to one test's data; opens, reopens and finally closes its stores."""

    def __init__(self, spec: BackendSpec, tmp_path: Path) -> None:
        self.spec = spec
        self.kind = spec.kind
        self.tmp_path = tmp_path
        self._open_stores: list[Store] = []

    # capabilities
    @property
    def durable(self) -> bool:
        return self.spec.durable

    @property
    def shared(self) -> bool:
        return self.spec.shared

    @property
    def file_based(self) -> bool:
        return self.spec.file_based

    def require(self, capability: str) -> None:
        if not getattr(self.spec, capability):
            pytest.skip(f"the {self.kind} backend is not {capability}")

    @property
    def path(self) -> Path:
        self.require("file_based")
        assert self.spec.data_path is not None
        return self.spec.data_path(self.tmp_path)

    # opening
    def _track(self, store: Store) -> Store:
        self._open_stores.append(store)
        return store

    def new(self, **options: Any) -> Store:
        """A store over this test's data (fresh for the first call)."""
        return self._track(self.spec.open(self.tmp_path, {**DEFAULT_OPTIONS, **options}))

    def another(self, **options: Any) -> Store:
        """A second, simultaneously open store object over the same data (like another process)."""
        self.require("shared")
        return self.new(**options)

    def reopen(self, store: Store, **options: Any) -> Store:
        """Close ``store`` and open the same data again."""
        self.require("durable")
        self.close(store)
        return self.new(**options)

    def open_file(self, path: Path, **options: Any) -> Store:
        self.require("file_based")
        assert self.spec.open_file is not None
        return self._track(self.spec.open_file(path, {**DEFAULT_OPTIONS, **options}))

    def child_source(self) -> str:
        if self.spec.child_source is None:
            pytest.skip(f"the {self.kind} backend cannot be opened from a child process")
        return self.spec.child_source(self.tmp_path)

    def close(self, store: Store) -> None:
        if store in self._open_stores:
            self._open_stores.remove(store)
        store.close()

    def close_all(self) -> None:
        errors = []
        while self._open_stores:
            store = self._open_stores.pop()
            try:
                store.close()
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
        if errors:
            raise errors[0]


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        return True


def store_factory(kind: str, tmp_path: Path) -> StoreBackend:
    """The backend ``kind`` bound to ``tmp_path``; skips the test when it is not installed."""
    spec = BACKENDS[kind]
    for module in (*spec.requires, spec.module):
        if _missing(module):
            pytest.skip(f"store backend {kind!r} unavailable: module {module!r} not installed")
    importlib.import_module(spec.module)  # a real import error inside the backend fails loudly
    return StoreBackend(spec, tmp_path)


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path):
    harness = store_factory(request.param, tmp_path)
    yield harness
    harness.close_all()


@pytest.fixture
def store(backend: StoreBackend) -> Store:
    """A fresh store of the backend under test, with no background watchdog."""
    return backend.new()


# ---- small helpers shared by the suite --------------------------------------------------------


class Kit:
    """Shortcuts that keep the tests focused on the behaviour they check."""

    @staticmethod
    def claim(store: Store, input: Any = None, worker_id: str | None = "w-1", **enqueue: Any) -> AttemptedRollout:
        """Enqueue one rollout and dequeue it (the queue must hold nothing older)."""
        rollout = store.enqueue_rollout(input, **enqueue)
        claimed = store.dequeue_rollout(worker_id=worker_id)
        assert claimed is not None, "dequeue returned nothing right after an enqueue"
        assert claimed.rollout.rollout_id == rollout.rollout_id
        return claimed

    @staticmethod
    def start(store: Store, input: Any = None, **enqueue: Any) -> AttemptedRollout:
        """Enqueue, dequeue and move the attempt to ``running``; returns the fresh state."""
        claimed = Kit.claim(store, input, **enqueue)
        rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
        attempt = store.update_attempt(rid, aid, "running")
        return AttemptedRollout(rollout=store.get_rollout(rid), attempt=attempt)

    @staticmethod
    def span(rollout_id: str, attempt_id: str, name: str = "step", **kwargs: Any) -> Span:
        return Span(rollout_id=rollout_id, attempt_id=attempt_id, name=name, **kwargs)

    @staticmethod
    def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.02) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                return value
            time.sleep(interval)

    @staticmethod
    def later(delay: float, fn: Callable[[], Any]) -> threading.Thread:
        """Run ``fn`` in another thread after ``delay`` seconds (joined by the caller)."""
        errors: list[BaseException] = []

        def body() -> None:
            time.sleep(delay)
            try:
                fn()
            except BaseException as exc:  # surfaced through thread.errors
                errors.append(exc)

        thread = threading.Thread(target=body, daemon=True)
        thread.errors = errors  # type: ignore[attr-defined]
        thread.start()
        return thread


@pytest.fixture
def kit() -> type[Kit]:
    return Kit
