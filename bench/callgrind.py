"""Instruction counts of a benchmark's phases, under valgrind's callgrind.

Wall-clock time on a shared machine moves by up to 2x from one minute to the next; the number of
instructions a phase executes does not (same binaries, same inputs, ``PYTHONHASHSEED=0``), so it
is what compares two versions of the code. Kernel work (system calls, an SQLite commit's writes)
is not counted: for those, compare time in runs that alternate the versions.

The harness runs a benchmark child under ``valgrind --tool=callgrind --instr-atstart=no``; the
child brackets each phase with :class:`PhaseCounter` (callgrind client requests, made through a
tiny C shim compiled here with the machine's ``gcc`` and valgrind's headers), and
:func:`count_phases` reads one dump per phase back. Needs ``valgrind`` and ``gcc``.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

SHIM_ENV = "AGENTGRAD_CALLGRIND_SHIM"

_SHIM_SOURCE = """
#include <valgrind/callgrind.h>
void phase_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void phase_end(const char *name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
"""


class PhaseCounter:
    """In the child: ``start()`` before a phase, ``end(name)`` after it (no-ops outside callgrind)."""

    def __init__(self) -> None:
        self._lib = ctypes.CDLL(os.environ[SHIM_ENV])

    def start(self) -> None:
        self._lib.phase_start()

    def end(self, name: str) -> None:
        self._lib.phase_end(name.encode())


def count_phases(command: list[str], env: dict[str, str] | None = None) -> dict[str, int]:
    """Run ``command`` (a child using :class:`PhaseCounter`) under callgrind; instructions per phase."""
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            raise SystemExit(f"--instructions needs {tool} on PATH")
    with tempfile.TemporaryDirectory() as work:
        shim = Path(work, "phases.so")
        source = Path(work, "phases.c")
        source.write_text(_SHIM_SOURCE)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(source)], check=True)
        child_env = {**os.environ, **(env or {}), SHIM_ENV: str(shim), "PYTHONHASHSEED": "0"}
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={work}/cg.out", *command],
            env=child_env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        counts: dict[str, int] = {}
        for dump in glob.glob(f"{work}/cg.out*"):
            text = Path(dump).read_text()
            name = re.search(r"^desc: Trigger: Client Request: (\S+)", text, re.M)
            total = re.search(r"^(?:totals|summary): (\d+)", text, re.M)
            if name and total:
                counts[name.group(1)] = int(total.group(1))
        return counts
