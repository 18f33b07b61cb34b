"""Suite-wide policy.

* Tests marked ``slow`` (whole learning runs, minutes each) run only when asked for —
  ``pytest -m slow`` or ``AGENTGRAD_SLOW=1`` (``make test-slow``).
* Tests run tiny models with one torch thread: fastest for models this small, and far faster on
  a shared, busy CPU (``OMP_NUM_THREADS`` is inherited by the subprocesses some tests start).
* Tests marked ``tiny_model`` (they need the built tiny model) run last, so a model build started
  in the background (``make test``) overlaps the rest of the suite; they wait for it on
  ``ensure_tiny_model``'s lock before their clock (pytest-timeout's) starts.

Fixtures shared by every folder: ``memory_store``, ``local_store`` (memory and SQLite), the
session's ``tiny_model_dir`` (random weights) and the frameworks suites' ``capture``. The store
conformance suite (``tests/store/conftest.py``) has its own ``store`` over every backend.

This file is also the root conftest of ``tests/frameworks_compat``, run in ``.venv-compat``
(pytest, agentgrad and openai 2.x; no torch): it imports nothing heavy at module level.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from opt_in import skip_unless_selected

if TYPE_CHECKING:
    from capture_check import Capture

    from agentgrad.store.memory import MemoryStore
    from agentgrad.store.protocol import Store

os.environ.setdefault("OMP_NUM_THREADS", "1")
if importlib.util.find_spec("torch") is not None:
    import torch

    torch.set_num_threads(1)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if "tiny_model" in item.keywords and importlib.util.find_spec("torch") is not None:
        from agentgrad.demo.tiny import ensure_tiny_model

        ensure_tiny_model()
    yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: "tiny_model" in item.keywords)  # stable: file order otherwise kept
    skip_unless_selected(config, items, "slow", "AGENTGRAD_SLOW", "-m slow or AGENTGRAD_SLOW=1 (make test-slow)")


def _openai_major() -> int:
    try:
        from importlib.metadata import version

        return int(version("openai").split(".")[0])
    except Exception:  # not installed
        return 0


# tests/frameworks_compat needs openai 2.x (CrewAI, LlamaIndex): it runs in .venv-compat, started
# from tests/frameworks/test_fw_compat_venv.py, never in the main environment's collection.
collect_ignore = ["frameworks_compat"] if _openai_major() >= 3 else []


# ---- shared fixtures ----------------------------------------------------------------------------


@pytest.fixture
def memory_store() -> Iterator[MemoryStore]:
    """A fresh in-memory store without a background watchdog (tests call ``check_watchdog()``)."""
    from agentgrad.store.memory import MemoryStore

    store = MemoryStore(watchdog_interval=None)
    yield store
    store.close()


@pytest.fixture(params=["memory", "sqlite"])
def local_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each in-process backend in turn (memory, then SQLite in ``tmp_path``), without a background
    watchdog. The full four-backend suite is ``tests/store``'s ``store``."""
    from agentgrad.store.memory import MemoryStore
    from agentgrad.store.sqlite import SqliteStore

    store = (
        MemoryStore(watchdog_interval=None)
        if request.param == "memory"
        else SqliteStore(tmp_path / "store.db", watchdog_interval=None)
    )
    yield store
    store.close()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-initialised tiny model (the demo's tokenizer and config, seed 0), built once per
    session in < 1 s; tests only read it. (The trained demo model is ``ensure_tiny_model()``.)"""
    pytest.importorskip("torch")
    from agentgrad.demo.tiny import random_tiny_model

    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def capture() -> Iterator[Capture]:
    """The frameworks suites' upstream: the tiny model's engine (or its stand-in) behind a capture
    proxy over a memory store (``tests/support/capture_check.py``)."""
    from capture_check import serve_upstream

    with serve_upstream() as served:
        yield served
