"""A clock that moves only when a test moves it: pass it as a store's ``clock=`` and call
``advance`` instead of ``time.sleep``, then ``store.check_watchdog()`` for a sweep at that time."""

from __future__ import annotations

import threading
import time


class ManualClock:
    """Wall-clock seconds since the epoch, starting at the real time and frozen between calls
    to :meth:`advance`."""

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` forward; returns the new time."""
        if seconds < 0:
            raise ValueError(f"a clock moves forward only, not by {seconds}")
        with self._lock:
            self._now += seconds
            return self._now
