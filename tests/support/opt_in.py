"""Opt-in test markers: tests marked ``slow`` or ``chaos_long`` take minutes, so ``make test``
skips them unless the marker is selected (``-m MARKER``) or an environment variable asks."""

from __future__ import annotations

import os

import pytest


def skip_unless_selected(config: pytest.Config, items: list[pytest.Item], marker: str, env: str, how: str) -> None:
    """Skip the items marked ``marker`` unless ``-m`` names it or ``$env`` is ``1``; ``how`` says
    how to run them in the skip reason."""
    if marker in (config.getoption("-m") or "") or os.environ.get(env) == "1":
        return
    skip = pytest.mark.skip(reason=f"{marker}: run with {how}")
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)
