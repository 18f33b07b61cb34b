"""Stopping a run by Ctrl-C or SIGTERM between the parts of a step that must not be cut.

An interrupt (``KeyboardInterrupt``) lands wherever the main thread happens to be. Inside an
optimizer update, a weight publish or a checkpoint write it would leave the policy, the engine's
weights or the checkpoint half-written, and the run could not resume from it. Those parts run
under :func:`deferred_interrupts`: a SIGINT or SIGTERM that arrives there is held, and acted on
(as the signal's own handler would have) when the part ends — seconds later. Everywhere else, and
above all while a step waits for its rollouts, the interrupt lands at once.

:func:`terminate_as_interrupt` makes SIGTERM (what a scheduler, ``timeout`` or ``docker stop``
sends) raise the same ``KeyboardInterrupt`` Ctrl-C raises, so a stopped run cleans up — its
runners, engine and store — and saves its last step, instead of dying where it stood.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block; on leaving it, act on the first one held as its
    handler before the block would have (raise ``KeyboardInterrupt``; for a signal left to the
    system's default, deliver it again). Outside the main thread, where Python delivers no
    signals, it does nothing. Blocks nest."""
    if not _main_thread():
        yield
        return
    held: list[signal.Signals] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signal.Signals(signum))

    previous = {number: signal.getsignal(number) for number in _SIGNALS}
    # an ignored signal stays ignored; None: a handler installed outside Python, left alone
    taken = {number: handler for number, handler in previous.items() if handler not in (signal.SIG_IGN, None)}
    for number in taken:
        signal.signal(number, hold)
    try:
        yield
    finally:
        for number, handler in taken.items():
            signal.signal(number, handler)
        if held:
            handler = taken[held[0]]
            if callable(handler):
                handler(held[0], None)
            else:  # SIG_DFL: what the signal would have done, now
                signal.raise_signal(held[0])


def terminate_as_interrupt() -> None:
    """From now on SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does — unless
    something already handles or ignores it. Commands that serve until SIGTERM install their own
    handler after this, and keep it."""
    if _main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
