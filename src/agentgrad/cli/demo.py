"""``agentgrad demo``: train the calculator agent with GRPO on the tiny model, on a laptop CPU.

Everything runs embedded (see ``agentgrad.demo.run``): a SQLite store file in the output directory,
the local engine, the capture proxy, runner processes and GRPO. It prints greedy success on
held-out problems before and after, writes a reward curve and leaves the store for the dashboard.
"""

from __future__ import annotations

import argparse
from typing import Any

from agentgrad.demo.run import DEMO_SETTINGS, run_demo


def _cmd_demo(args: argparse.Namespace) -> int:
    tunable = ("lr", "batch_size", "group_size", "temperature", "mini_batches", "epochs", "tis_cap")
    overrides = {key: getattr(args, key) for key in tunable if getattr(args, key) is not None}
    if args.overlap:
        overrides["overlap"] = True
    run_demo(
        steps=args.steps,
        minutes=args.minutes,
        output_dir=args.output_dir,
        n_runners=args.n_runners,
        store_url=args.store,
        resume=args.resume,
        threads=args.threads,
        settings=overrides,
    )
    return 0


def add_commands(subparsers: Any) -> None:
    """Register ``agentgrad demo`` (the main CLI calls this)."""
    parser = subparsers.add_parser(
        "demo",
        help="train the calculator agent with GRPO on the tiny model (CPU)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps (default 30, ≈ 2–3 min on 2 cores)")
    parser.add_argument("--minutes", type=float, default=8.0, help="wall-clock cap for training (default 8)")
    parser.add_argument("--output-dir", default="./runs/demo", help="store, metrics, checkpoints, plot")
    parser.add_argument("--n-runners", type=int, default=2, help="runner processes (default 2)")
    parser.add_argument("--store", default=None, help="store URL (default: sqlite file in the output dir)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for engine and trainer (default 1)")
    parser.add_argument("--resume", action="store_true", help="continue from the output dir's last checkpoint")
    parser.add_argument("--lr", type=float, default=None, help=f"learning rate (default {DEMO_SETTINGS['lr']})")
    parser.add_argument(
        "--batch-size", type=int, default=None, help=f"tasks per step (default {DEMO_SETTINGS['batch_size']})"
    )
    parser.add_argument(
        "--group-size", type=int, default=None, help=f"rollouts per task (default {DEMO_SETTINGS['group_size']})"
    )
    parser.add_argument(
        "--mini-batches",
        type=int,
        default=None,
        help=f"optimizer updates per pass over a step's rollouts (default {DEMO_SETTINGS['mini_batches']})",
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help=f"passes over a step's rollouts (default {DEMO_SETTINGS['epochs']})"
    )
    parser.add_argument(
        "--temperature", type=float, default=None, help=f"sampling temperature (default {DEMO_SETTINGS['temperature']})"
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="sample the next batch while the trainer updates (one version stale, TIS-corrected; docs/algorithms.md)",
    )
    parser.add_argument(
        "--tis-cap",
        type=float,
        default=None,
        help=f"with --overlap: the truncated importance weight's cap (default {DEMO_SETTINGS['tis_cap']})",
    )
    parser.set_defaults(func=_cmd_demo)
