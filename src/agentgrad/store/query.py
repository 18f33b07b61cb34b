"""Rollout filtering, ordering and paging for backends that hold records in Python."""

from __future__ import annotations

from collections.abc import Iterable

from agentgrad.store.protocol import RolloutFilter
from agentgrad.types import Rollout


def matches(rollout: Rollout, f: RolloutFilter) -> bool:
    return (
        (f.status is None or rollout.status in f.status)
        and (f.mode is None or rollout.mode == f.mode)
        and (f.rollout_ids is None or rollout.rollout_id in f.rollout_ids)
        and (f.group_id is None or rollout.metadata.get("group_id") == f.group_id)
        and (f.resources_id is None or rollout.resources_id == f.resources_id)
        and (f.no_llm_calls is None or (rollout.status.is_terminal and rollout.llm_calls == 0) == f.no_llm_calls)
    )


def filter_and_page(rollouts: Iterable[Rollout], f: RolloutFilter) -> list[Rollout]:
    """Filter, then sort (missing values last, ties by enqueue order), then page."""
    selected = [r for r in rollouts if matches(r, f)]
    key = f.sort_by

    def sort_key(r: Rollout) -> tuple:
        value = getattr(r, key)
        value = value.value if key == "status" else value
        return (value is None, value if value is not None else 0, r.enqueue_time, r.rollout_id)

    present = sorted((r for r in selected if getattr(r, key) is not None), key=sort_key, reverse=f.descending)
    missing = [r for r in selected if getattr(r, key) is None]
    ordered = present + missing
    end = None if f.limit is None else f.offset + f.limit
    return ordered[f.offset : end]
