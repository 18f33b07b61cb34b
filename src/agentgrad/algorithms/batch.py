"""Run a batch of rollouts: enqueue, wait, deal with the stragglers — for every algorithm.

Every algorithm samples the same way, through the store, so that runners anywhere do the work.
They differ only in what a rollout still running at the deadline means to them, so that is the
one argument each must choose (``on_straggler``):

* ``"cancel"`` (GRPO, Evaluate): a training step or a report cannot wait forever for one stuck
  agent. The stragglers are cancelled and then count as failed rollouts, and the number is
  logged: a batch that keeps losing rollouts to the deadline is a finding, not a detail.
* ``"raise"`` (APO, SFT): scores from part of a validation batch would compare candidates
  unfairly, and a sample cut short at an arbitrary deadline is not the sample asked for. The
  stragglers keep running, and a resumed run finds them in the store.

With ``timeout=None`` there is no deadline, so no straggler, whatever the policy.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from agentgrad.errors import AgentGradError, InvalidTransitionError
from agentgrad.store.protocol import RolloutRequest, Store
from agentgrad.types import Rollout

log = logging.getLogger(__name__)

OnStraggler = Literal["cancel", "raise"]


class StragglersError(AgentGradError, TimeoutError):
    """Rollouts of a batch were still running at the deadline (policy ``"raise"``); they still are."""

    def __init__(self, label: str, unfinished: int, total: int, timeout: float) -> None:
        self.unfinished, self.total, self.timeout = unfinished, total, timeout
        super().__init__(
            f"{label}: {unfinished} of {total} rollout(s) did not finish within {timeout:g} s "
            "— are runners serving the agent?"
        )


@dataclass
class Batch:
    """What a batch came to: its rollouts in the order asked, as the store has them on return."""

    rollouts: list[Rollout]
    #: Stragglers this call cancelled (policy ``"cancel"``); every other rollout finished by itself.
    cancelled: int = 0

    @property
    def finished(self) -> int:
        """Rollouts that finished by themselves (one that finished just before its cancel counts)."""
        return len(self.rollouts) - self.cancelled


def run_batch(
    store: Store,
    requests: Sequence[RolloutRequest],
    *,
    timeout: float | None,
    on_straggler: OnStraggler,
    label: str = "batch",
) -> Batch:
    """Enqueue ``requests`` (atomically: all or none) and wait for them; see :func:`wait_batch`."""
    _check(timeout, on_straggler)
    ids = [r.rollout_id for r in store.enqueue_rollouts(list(requests))]
    return wait_batch(store, ids, timeout=timeout, on_straggler=on_straggler, label=label)


def wait_batch(
    store: Store, rollout_ids: Sequence[str], *, timeout: float | None, on_straggler: OnStraggler, label: str = "batch"
) -> Batch:
    """Wait for rollouts already in the store (a resumed run's, or just enqueued) to finish.

    ``timeout``: seconds until the rollouts still running are stragglers, treated per
    ``on_straggler`` (module docstring). ``label`` names the batch in logs and errors.
    """
    _check(timeout, on_straggler)
    ids = list(rollout_ids)
    finished = store.wait_for_rollouts(ids, timeout)
    if len(finished) >= len(ids):
        return Batch(finished)
    assert timeout is not None  # without a deadline the wait returns only when all are done
    if on_straggler == "raise":
        raise StragglersError(label, len(ids) - len(finished), len(ids), timeout)
    return _cancel_stragglers(store, ids, {r.rollout_id for r in finished}, timeout, label)


def cancel_unfinished(store: Store, rollout_ids: Sequence[str]) -> int:
    """Cancel those of ``rollout_ids`` that have not finished (queued or running); return how many."""
    cancelled = 0
    for rollout_id in rollout_ids:
        try:
            store.cancel_rollout(rollout_id)
            cancelled += 1
        except InvalidTransitionError:  # finished already, or between the wait and the cancel
            pass
    return cancelled


def _cancel_stragglers(store: Store, ids: list[str], done: set[str], timeout: float, label: str) -> Batch:
    cancelled = cancel_unfinished(store, [rollout_id for rollout_id in ids if rollout_id not in done])
    if cancelled:
        log.warning(
            "%s: cancelled %d of %d rollout(s) still running after %g s (they count as failed)",
            label,
            cancelled,
            len(ids),
            timeout,
        )
    return Batch([store.get_rollout(rollout_id) for rollout_id in ids], cancelled)


def _check(timeout: float | None, on_straggler: str) -> None:
    if on_straggler not in get_args(OnStraggler):
        raise ValueError(f"on_straggler must be one of {get_args(OnStraggler)}, got {on_straggler!r}")
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be None or ≥ 0 seconds, got {timeout!r}")
