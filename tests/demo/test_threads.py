"""The build's torch thread count follows the machine's load (agentgrad.demo.threads)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentgrad.demo import threads


def test_threads_for_counts_only_nearly_idle_cores_as_free() -> None:
    assert threads.threads_for(0.0, cpus=2, max_threads=2) == 2
    assert threads.threads_for(0.25, cpus=2, max_threads=2) == 2
    assert threads.threads_for(0.5, cpus=2, max_threads=2) == 1
    assert threads.threads_for(1.8, cpus=2, max_threads=2) == 1  # never fewer than one
    assert threads.threads_for(1.0, cpus=16, max_threads=2) == 2  # never more than asked


@pytest.mark.skipif(not threads.PROC_STAT.exists(), reason="needs /proc/stat")
def test_a_busy_process_takes_a_thread_away(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)  # as on a 2-core machine, whatever this one has
    before = torch.get_num_threads()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        adaptive = threads.AdaptiveThreads(max_threads=2)
        time.sleep(1.5)
        assert adaptive.decide() == 1 and torch.get_num_threads() == 1
    finally:
        busy.kill()
        busy.wait()
        torch.set_num_threads(before)


def test_without_proc_stat_the_count_stays_at_the_maximum(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(threads, "PROC_STAT", tmp_path / "missing")
    before = torch.get_num_threads()
    try:
        adaptive = threads.AdaptiveThreads(max_threads=2)
        time.sleep(0.6)
        assert adaptive.decide() == 2
    finally:
        torch.set_num_threads(before)
