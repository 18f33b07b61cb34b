"""The Algorithm protocol: how an algorithm plugs into ``Trainer.fit()``.

An algorithm only talks to the store: it enqueues rollouts, publishes resources, waits, reads
spans and learns. The Trainer supplies the context (store, tasks, running runners) and owns
their lifetime, so algorithms never start or stop processes themselves.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console

from agentgrad.store.protocol import Store

if TYPE_CHECKING:
    from agentgrad.training.local import LocalPolicy


def is_live(console: Console) -> bool:
    """Whether ``console`` shows its output as it comes (a terminal or a notebook), rather than
    writing it to a file or a pipe: where a live progress bar can be drawn."""
    return console.is_terminal or console.is_jupyter


def run_console() -> Console:
    """The console a run prints to. Written to a file or a pipe (a log), it does not wrap lines at
    rich's 80 columns: a path or a step's metrics cut across lines can be neither copied nor
    searched. In a terminal rich wraps to the terminal's width, as always."""
    console = Console()
    console.soft_wrap = not is_live(console)
    return console


@dataclass
class AlgorithmContext:
    """What ``Trainer.fit()`` hands an algorithm."""

    store: Store
    train_tasks: Sequence[Any] = ()
    val_tasks: Sequence[Any] = ()
    #: Resources published before the run (``Trainer.fit(resources=…)``), if any.
    initial_resources: dict[str, Any] | None = None
    console: Console = field(default_factory=run_console)
    #: The local policy the runners' agents call (``Trainer(policy=…)``), started; None when the
    #: model is served elsewhere. Weight-training algorithms publish through ``policy.publisher()``.
    policy: LocalPolicy | None = None


class Algorithm(abc.ABC):
    """Subclass and implement :meth:`run`; the return value is what ``fit()`` returns."""

    @abc.abstractmethod
    def run(self, context: AlgorithmContext) -> Any:
        """Drive rollouts through ``context.store`` until done."""
