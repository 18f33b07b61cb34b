"""Shared fixtures: one random-initialised tiny model, engine and live server per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentgrad.demo.tiny import random_tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def engine(tiny_dir: Path) -> Iterator:
    from agentgrad.inference import Engine

    eng = Engine(tiny_dir, max_batch_size=16)
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def base_url(engine) -> Iterator[str]:
    from agentgrad.inference import ModelServer

    server = ModelServer(engine, served_model_name="tiny")
    url = server.start()
    yield url
    server.stop()
