"""What every place that wraps a model in a peft ``PeftModel``, or swaps its adapters, shares."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


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
