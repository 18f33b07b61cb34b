"""RL tests run tiny models: one torch thread is fastest, and far faster on a shared, busy CPU."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the subprocesses some tests start

try:
    import torch
except ImportError:  # the adapter tests need no torch
    pass
else:
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Slow tests (the full demo) run only when asked for: ``pytest -m slow``."""
    import pytest

    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
