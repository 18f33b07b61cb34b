"""Framework integration tests: idiomatic agents, unchanged, through the proxy and the engine.

Their ``capture`` fixture (engine + capture proxy, once per session) is in ``tests/conftest.py``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # else the Agents SDK exports to OpenAI
