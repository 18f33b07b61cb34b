"""APO's candidate prompts per run and round, read back with APO's own reader
(:meth:`agentgrad.algorithms.apo.APOState.load`), for the prompt A/B view."""

from __future__ import annotations

from dataclasses import dataclass

from agentgrad.algorithms.apo import APO_ITEM, APOState, Candidate, val_group

__all__ = ["apo_runs", "rounds", "val_group", "Round"]
from agentgrad.store.protocol import Store
from agentgrad.types import JsonResource, Resources


def apo_runs(snapshots: list[Resources]) -> dict[str, str]:
    """APO run id → the name of the prompt it tunes, from the lineage item on its snapshots."""
    runs: dict[str, str] = {}
    for snapshot in snapshots:
        meta = snapshot.items.get(APO_ITEM)
        if isinstance(meta, JsonResource) and isinstance(meta.value, dict) and meta.value.get("kind") == "candidate":
            run, prompt = meta.value.get("run_id"), meta.value.get("prompt_name")
            if isinstance(run, str) and isinstance(prompt, str):
                runs.setdefault(run, prompt)
    return runs


@dataclass
class Round:
    number: int
    candidates: list[Candidate]


def rounds(store: Store, run_id: str, prompt_name: str) -> tuple[list[Round], Candidate | None]:
    """The run's candidates grouped by round (best score first within a round), and the best
    candidate overall (None before any is scored)."""
    state = APOState.load(store, run_id, prompt_name)
    by_round: dict[int, list[Candidate]] = {}
    for candidate in state.candidates.values():
        by_round.setdefault(candidate.round, []).append(candidate)
    out = [
        Round(n, sorted(c, key=lambda c: (c.score is None, -(c.score or 0.0), c.version)))
        for n, c in sorted(by_round.items())
    ]
    ranked = state.ranked()
    return out, ranked[0] if ranked else None
