"""The ``agentgrad`` command run in a child process, as a user's shell runs it: this checkout's
package and ``tests/support`` importable, a wide terminal (rich does not wrap the lines a test
reads), one torch thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "COLUMNS": "160",
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests" / "support")]),
}


def agentgrad(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``agentgrad ARGS…`` in ``cwd``; its exit status, stdout and stderr (text)."""
    return subprocess.run(
        [sys.executable, "-m", "agentgrad", *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout
    )
