"""``agentgrad rollouts list|show``: inspect the rollouts in a store."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_commands(commands: Any) -> None:
    """Register ``rollouts`` (``list``, ``show``)."""
    rollouts = commands.add_parser("rollouts", help="inspect rollouts in a store")
    rollout_commands = rollouts.add_subparsers(dest="rollouts_command", metavar="ACTION", required=True)
    listing = rollout_commands.add_parser("list", help="a table of rollouts")
    listing.add_argument("--store", required=True, help="store URL")
    listing.add_argument("--status", action="append", help="filter by status (repeatable)")
    listing.add_argument("--mode", choices=["train", "val", "test"])
    listing.add_argument(
        "--sort",
        default="enqueue_time",
        choices=["enqueue_time", "start_time", "end_time", "rollout_id", "status", "reward"],
    )
    listing.add_argument("--ascending", action="store_true", help="oldest first (default: newest first)")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--offset", type=int, default=0)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_cmd_rollouts_list)
    show = rollout_commands.add_parser(
        "show", help="one rollout: its span tree and each LLM call's conversation (--json: every record)"
    )
    show.add_argument("rollout_id")
    show.add_argument("--store", required=True, help="store URL")
    show.add_argument(
        "--json", action="store_true", help="print the rollout, all its attempts and all their spans as JSON"
    )
    show.set_defaults(func=_cmd_rollouts_show)


def _cmd_rollouts_list(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from agentgrad.store import RolloutFilter, open_store

    with open_store(args.store, watchdog=False, existing=True) as store:
        query = RolloutFilter(
            status=args.status or None,
            mode=args.mode,
            sort_by=args.sort,
            descending=not args.ascending,
            limit=args.limit,
            offset=args.offset,
        )
        rollouts = store.query_rollouts(query)
        total = store.count_rollouts(query)
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in rollouts]))
        return 0
    # Short headers and no column rules: the seven columns fit an 80-column terminal uncut (ids
    # are for copy-paste, statuses for reading).
    table = Table(
        title=f"rollouts {args.offset + 1}–{args.offset + len(rollouts)} of {total}",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        show_edge=False,
        pad_edge=False,
    )
    for column in ("rollout_id", "status", "mode", "reward", "attempts", "LLM calls", "seconds"):
        table.add_column(column, no_wrap=True)
    for r in rollouts:
        duration = f"{r.end_time - r.start_time:.2f}" if r.end_time and r.start_time else ""
        table.add_row(
            r.rollout_id,
            r.status.value,
            r.mode,
            "" if r.reward is None else f"{r.reward:.3g}",
            str(r.num_attempts),
            str(r.llm_calls),
            duration,
        )
    Console().print(table)
    return 0


def _cmd_rollouts_show(args: argparse.Namespace) -> int:
    from agentgrad.store import open_store

    with open_store(args.store, watchdog=False, existing=True) as store:
        rollout = store.get_rollout(args.rollout_id)
        attempts = store.get_attempts(args.rollout_id)
        spans = store.query_spans(args.rollout_id, None if args.json else "latest")
    if not args.json:
        from agentgrad.cli.transcript import transcript

        for line in transcript(rollout, attempts, spans):
            print(line)
        return 0
    print(
        json.dumps(
            {
                "rollout": rollout.model_dump(mode="json"),
                "attempts": [a.model_dump(mode="json") for a in attempts],
                "spans": [s.model_dump(mode="json") for s in spans],
            },
            indent=2,
        )
    )
    return 0
