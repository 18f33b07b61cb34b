"""Suite-wide policy.

* Tests marked ``slow`` (whole learning runs, minutes each) run only when asked for —
  ``pytest -m slow`` or ``AGENTGRAD_SLOW=1`` (``make test-slow``).
* Tests run tiny models with one torch thread: fastest for models this small, and far faster on
  a shared, busy CPU (``OMP_NUM_THREADS`` is inherited by the subprocesses some tests start).
* Tests marked ``tiny_model`` (they need the built tiny model) run last, so a model build started
  in the background (``make test``) overlaps the rest of the suite; they wait for it on
  ``ensure_tiny_model``'s lock before their clock (pytest-timeout's) starts.
"""

import importlib.util
import os
from collections.abc import Iterator

import pytest

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
