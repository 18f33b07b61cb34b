"""How many torch threads a CPU build should use, decided again as the machine's load changes.

On a small machine the right count depends on what else runs. Measured on 2 cores with the tiny
model's training step: idle, two threads take 0.30 s and one 0.43 s; with another process holding
a core, two threads take 0.90 s (torch's pool spins, waiting for a thread that is not scheduled)
and one 0.43 s. A build that runs beside other work (the test suite, an install) should use one
thread while that work runs and two once it stops. ``AdaptiveThreads`` measures, between two
decisions, how many cores the rest of the machine kept busy (``/proc/stat`` minus this process's
own CPU time) and gives torch what is left. The thread count does not change the build's numerics
(same weights, byte for byte, with one thread or two).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def default_max_threads() -> int:
    """Two at most: more were not faster on matrices this small."""
    return min(2, os.cpu_count() or 1)


def threads_for(others_busy_cores: float, cpus: int, max_threads: int) -> int:
    """Threads for the cores other processes leave free. A core counts as free when they used at
    most 0.3 of it: spinning threads lose more to a little contention than a second thread gains."""
    return max(1, min(max_threads, int(cpus - others_busy_cores + 0.3)))


def _busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot, or None where /proc is missing."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class AdaptiveThreads:
    """Sets ``torch.set_num_threads`` from the cores other processes left free since the last call.

    ``decide()`` is cheap (one read of /proc/stat); call it every few dozen steps. Where /proc/stat
    does not exist, it keeps ``max_threads``.
    """

    def __init__(self, max_threads: int | None = None) -> None:
        self.max_threads = max_threads or default_max_threads()
        self.threads = self.max_threads
        self._mark = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float | None, float]:
        return time.monotonic(), _busy_cpu_seconds(), time.process_time()

    def decide(self) -> int:
        """The thread count for the next stretch of work (also applied to torch)."""
        import torch

        now = self._sample()
        (wall0, busy0, own0), (wall1, busy1, own1) = self._mark, now
        self._mark = now
        if busy0 is not None and busy1 is not None and wall1 - wall0 > 0.5:
            others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall1 - wall0)
            self.threads = threads_for(others, os.cpu_count() or 1, self.max_threads)
        torch.set_num_threads(self.threads)
        return self.threads
