"""The chaos suite: real processes killed by PID, stores that go away, replies that get lost.

Its fast cases (marker ``chaos``) run with the rest of the suite in ``make test``. The long ones
(marker ``chaos_long``: a minute-long store outage, runner kills waited out with the default
30 s heartbeat deadline) run only when asked for: ``make test-chaos``, ``pytest -m chaos_long``
or ``AGENTGRAD_CHAOS_LONG=1``.
"""

from __future__ import annotations

import pytest
from opt_in import skip_unless_selected


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_selected(
        config,
        items,
        "chaos_long",
        "AGENTGRAD_CHAOS_LONG",
        "make test-chaos (or -m chaos_long, AGENTGRAD_CHAOS_LONG=1)",
    )
