"""Servers the benchmarks start in processes of their own, and what those processes cost.

Imports nothing of agentgrad: each benchmark decides which code a server runs (its command and
``PYTHONPATH``), so a before/after comparison measures the version it names."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from pathlib import Path


def start_listening(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start ``command`` and wait until it prints ``listening on URL`` on stderr, as every
    AgentGrad server does; returns the process and that URL. A thread then drains its stderr, so
    that a server that logs a lot never blocks on a full pipe. The caller stops the process."""
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    for line in process.stderr:
        if found := re.search(r"listening on (http://\S+)", line):
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, found.group(1)
    process.wait(30)
    raise RuntimeError(f"{' '.join(command[:4])}… exited ({process.returncode}) before printing its URL")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux ``/proc``). Unlike wall time it
    barely moves with the load of a shared machine, so it compares versions measured minutes apart."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
