"""Shared fixtures: one engine and live server per session, over the root conftest's random
``tiny_model_dir``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path) -> Iterator:
    from agentgrad.inference import Engine

    eng = Engine(tiny_model_dir, max_batch_size=16)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def base_url(engine) -> Iterator[str]:
    from agentgrad.inference import ModelServer

    server = ModelServer(engine, served_model_name="tiny")
    url = server.start()
    yield url
    server.stop()
