"""The openai-2.x suite (CrewAI, LlamaIndex, plain openai 2.x), run by tests/frameworks/test_fw_compat_venv.py.

Its ``capture`` fixture is the root one (``tests/conftest.py``), as for ``tests/frameworks``.
"""

from __future__ import annotations

import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")  # never OTEL_SDK_DISABLED: it would switch ours off
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
