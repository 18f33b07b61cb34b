"""What every place AgentGrad calls transformers or peft shares: their bookkeeping noise kept out
of a run's output (progress bars per model loaded or saved, warnings about their own code)."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Iterator

_bars_lock = threading.Lock()
_bars_hidden = 0  # how many no_progress_bars blocks are open (the engine and the trainer load at once)
_bars_were_enabled = False


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """No transformers progress bars inside the block. A run loads its model in the engine, the
    trainer and each best-model test and saves it at each new best; a bar for each would break
    into the run's own live progress. ``HF_HUB_DISABLE_PROGRESS_BARS=0`` keeps them."""
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "0":
        yield
        return
    from transformers.utils import logging as hf_logging

    global _bars_hidden, _bars_were_enabled
    with _bars_lock:
        if _bars_hidden == 0:
            _bars_were_enabled = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
        _bars_hidden += 1
    try:
        yield
    finally:
        with _bars_lock:
            _bars_hidden -= 1
            if _bars_hidden == 0 and _bars_were_enabled:
                hf_logging.enable_progress_bar()


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Two warnings peft prints about its own bookkeeping, not the user's code, which would break
    into a training run's output: it asks transformers whether gradient checkpointing is on through
    a property transformers deprecated (``is_gradient_checkpointing``, a FutureWarning), and it says
    which adapter it made active when the engine deletes an old policy version's (the engine names
    the adapter of every request itself). Only those two are silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message="Adapter .* was active which is now deleted", category=UserWarning)
        yield
