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


def _openai_major() -> int:
    try:
        from importlib.metadata import version

        return int(version("openai").split(".")[0])
    except Exception:  # not installed
        return 0


# tests/frameworks_compat needs openai 2.x (CrewAI, LlamaIndex): it runs in .venv-compat, started
# from tests/frameworks/test_fw_compat_venv.py, never in the main environment's collection.
collect_ignore = ["frameworks_compat"] if _openai_major() >= 3 else []
