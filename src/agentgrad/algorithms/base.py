"""The Algorithm protocol: how an algorithm plugs into ``Trainer.fit()``.

An algorithm only talks to the store: it enqueues rollouts, publishes resources, waits, reads
spans and learns. The Trainer supplies the context (store, tasks, running runners) and owns
their lifetime, so algorithms never start or stop processes themselves.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from agentgrad.store.protocol import Store


@dataclass
class AlgorithmContext:
    """What ``Trainer.fit()`` hands an algorithm."""

    store: Store
    train_tasks: Sequence[Any] = ()
    val_tasks: Sequence[Any] = ()
    #: Resources published before the run (``Trainer(resources=…)``), if any.
    initial_resources: dict[str, Any] | None = None
    console: Console = field(default_factory=Console)
    #: Free-form objects an algorithm may need from the Trainer (e.g. a local engine).
    extras: dict[str, Any] = field(default_factory=dict)


class Algorithm(abc.ABC):
    """Subclass and implement :meth:`run`; the return value is what ``fit()`` returns."""

    @abc.abstractmethod
    def run(self, context: AlgorithmContext) -> Any:
        """Drive rollouts through ``context.store`` until done."""
