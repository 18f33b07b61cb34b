"""Interrupts held across the parts of a step that must not be cut, and SIGTERM as Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from agentgrad.training.interrupts import deferred_interrupts, terminate_as_interrupt


@pytest.fixture(autouse=True)
def handlers_restored() -> Iterator[None]:
    saved = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


def test_an_interrupt_inside_the_block_lands_when_it_ends() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            os.kill(os.getpid(), signal.SIGINT)
            finished.append("the update")  # not cut short
            with deferred_interrupts():  # blocks nest
                finished.append("the checkpoint")
        finished.append("after the block")  # never reached: the interrupt landed on leaving the block
    assert finished == ["the update", "the checkpoint"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back


def test_without_an_interrupt_the_block_changes_nothing() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with deferred_interrupts():
        pass
    assert signal.getsignal(signal.SIGTERM) is before


def test_outside_the_main_thread_it_does_nothing() -> None:
    seen = []

    def work() -> None:
        with deferred_interrupts():
            seen.append(signal.getsignal(signal.SIGINT))

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == [before]


def test_sigterm_raises_keyboard_interrupt_once_asked() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    terminate_as_interrupt()
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at once; the sleep is only its chance to


def test_a_handler_already_there_is_kept() -> None:
    def mine(signum, frame) -> None:  # e.g. a server's graceful stop
        pass

    signal.signal(signal.SIGTERM, mine)
    terminate_as_interrupt()
    assert signal.getsignal(signal.SIGTERM) is mine


def test_a_sigterm_left_to_the_default_still_ends_the_process_after_the_block() -> None:
    """A library user who never asked for SIGTERM to interrupt still gets the process ended — only
    after the part that must not be cut."""
    code = (
        "import os, signal, sys\n"
        "from agentgrad.training.interrupts import deferred_interrupts\n"
        "with deferred_interrupts():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    print('finished the part', flush=True)\n"
        "print('after the block', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM and done.stdout == "finished the part\n", done
