"""Suite-wide policy: tests marked ``slow`` (whole learning runs, minutes each) run only when
asked for — ``pytest -m slow`` or ``AGENTGRAD_SLOW=1`` (``make test-slow``)."""

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("-m") or "") or os.environ.get("AGENTGRAD_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow or AGENTGRAD_SLOW=1 (make test-slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
