"""CrewAI, LlamaIndex and openai 2.x need openai<3: their tests run in .venv-compat, from here.

The compat run reuses this session's engine (that venv has no torch) through two variables.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from capture_check import ENGINE_URL_ENV, MODEL_DIR_ENV, Capture

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py

REPO = Path(__file__).resolve().parents[2]
COMPAT_PYTHON = REPO / ".venv-compat" / "bin" / "python"


@pytest.mark.skipif(
    not COMPAT_PYTHON.exists(),
    reason="no .venv-compat (CrewAI/LlamaIndex/openai 2.x): run scripts/setup_framework_envs.sh",
)
def test_compat_venv_suite(capture: Capture) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    if capture.model_dir is None:  # no engine here either: the compat run uses its own stand-in
        env["AGENTGRAD_TEST_STUB_ENGINE"] = "1"
    else:
        env.update({ENGINE_URL_ENV: capture.engine_url, MODEL_DIR_ENV: capture.model_dir})
    result = subprocess.run(
        [str(COMPAT_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/frameworks_compat"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
