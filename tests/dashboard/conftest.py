"""Fixtures for the dashboard tests (data in ``dashboard_data.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dashboard_data import Filled, fill_by_hand

from agentgrad.store.memory import MemoryStore


@pytest.fixture
def filled() -> Iterator[Filled]:
    """A fresh in-memory store filled by hand (see :func:`fill_by_hand`)."""
    store = MemoryStore(watchdog_interval=None)
    try:
        yield fill_by_hand(store)
    finally:
        store.close()
