"""The ``agentgrad`` command line.

Every long-running piece starts from here with one command. Sub-commands of other parts
(store service, model server, …) register themselves through an ``add_commands(subparsers)``
function in their own package, imported only when the CLI starts, so each part owns its CLI.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgrad import __version__

#: Packages that contribute sub-commands; a missing optional extra only hides its commands.
_COMMAND_MODULES = (
    "agentgrad.store.cli",
    "agentgrad.inference.cli",
    "agentgrad.proxy.cli",
    "agentgrad.dashboard.cli",
    "agentgrad.algorithms.cli",
    "agentgrad.demo",
)


def load_agent(spec: str) -> Any:
    """``package.module:attribute`` → the agent object (a file path also works for the module)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not attribute:
        raise SystemExit(f"agent must look like module:attribute (e.g. examples.calc.agent:calc_agent), got {spec!r}")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        sys.path.insert(0, str(path.parent))
        module_name = path.stem
    else:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"cannot import {module_name!r}: {exc}") from None
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise SystemExit(f"module {module_name!r} has no attribute {attribute!r}") from None
    from agentgrad.runner import as_agent

    try:
        return as_agent(target)
    except TypeError as exc:  # not an agent, or a function of an unsupported shape
        raise SystemExit(f"{spec} is not an agent: {exc}") from None


def read_tasks(path: str) -> list[Any]:
    """Tasks from a JSONL file (one JSON value per line) or a JSON array file."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"cannot read tasks file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.msg != "Extra data":  # "Extra data": JSONL whose lines are arrays
                raise SystemExit(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}:{number}: not JSON ({exc.msg})") from None
    return tasks


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"agentgrad {__version__}")
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from agentgrad.trainer import Trainer
    from agentgrad.types import LLM, RolloutConfig

    agent = load_agent(args.agent)
    tasks = read_tasks(args.tasks)
    if args.limit:
        tasks = tasks[: args.limit]
    resources: dict[str, Any] = {}
    if args.llm_endpoint:
        resources["llm"] = LLM(endpoint=args.llm_endpoint, model=args.model or "default", api_key=args.api_key)
    trainer = Trainer(args.store, n_runners=args.n_runners, concurrency=args.concurrency)
    config = RolloutConfig(timeout_seconds=args.rollout_timeout) if args.rollout_timeout else None
    report = trainer.dev(agent, tasks, resources, timeout=args.timeout, config=config)
    if args.json:
        print(json.dumps(report.as_dict()))
    return 0 if report.succeeded else 1


def _cmd_runner(args: argparse.Namespace) -> int:
    import signal

    from agentgrad.runner import Runner
    from agentgrad.store import open_store

    store = open_store(args.store, watchdog=False)
    runner = Runner(load_agent(args.agent), store, concurrency=args.concurrency, max_rollouts=args.max_rollouts,
                    worker_id=args.worker_id)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: runner.stop())
    logging.getLogger("agentgrad").info("runner %s serving %s from %s", runner.worker_id, args.agent, args.store)
    print(f"runner {runner.worker_id} taking rollouts from {args.store} (Ctrl-C to stop)", flush=True)
    try:
        stats = runner.run()
    finally:
        store.close()
    print(f"runner stopped: {stats.succeeded} succeeded, {stats.failed} failed, {stats.handed_back} handed back")
    return 0


def _cmd_rollouts_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from agentgrad.store import RolloutFilter, open_store

    with open_store(args.store, watchdog=False) as store:
        query = RolloutFilter(status=args.status or None, mode=args.mode, sort_by=args.sort, descending=not args.ascending,
                              limit=args.limit, offset=args.offset)
        rollouts = store.query_rollouts(query)
        total = store.count_rollouts(query)
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in rollouts]))
        return 0
    table = Table(title=f"rollouts {args.offset + 1}–{args.offset + len(rollouts)} of {total}")
    for column in ("rollout_id", "status", "mode", "reward", "attempts", "llm calls", "duration s"):
        table.add_column(column, no_wrap=column == "rollout_id")  # ids are for copy-paste: never cut
    for r in rollouts:
        duration = f"{r.end_time - r.start_time:.2f}" if r.end_time and r.start_time else ""
        table.add_row(r.rollout_id, r.status.value, r.mode, "" if r.reward is None else f"{r.reward:.3g}",
                      str(r.num_attempts), str(r.llm_calls), duration)
    Console().print(table)
    return 0


def _cmd_rollouts_show(args: argparse.Namespace) -> int:
    from agentgrad.store import open_store

    with open_store(args.store, watchdog=False) as store:
        rollout = store.get_rollout(args.rollout_id)
        attempts = store.get_attempts(args.rollout_id)
        spans = store.query_spans(args.rollout_id)
    print(json.dumps({
        "rollout": rollout.model_dump(mode="json"),
        "attempts": [a.model_dump(mode="json") for a in attempts],
        "spans": [s.model_dump(mode="json") for s in spans],
    }, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgrad", description="Make LLM agents better from their own experience.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=_cmd_version)

    dev = commands.add_parser("dev", help="run every task once with an agent and print a summary")
    dev.add_argument("agent", help="module:attribute of an Agent or @rollout function")
    dev.add_argument("--tasks", required=True, help="tasks as JSONL (one JSON value per line) or a JSON array")
    dev.add_argument("--llm-endpoint", help="OpenAI-compatible base URL handed to the agent as resource 'llm'")
    dev.add_argument("--model", help="model name for the 'llm' resource")
    dev.add_argument("--api-key", default=None, help="API key for the 'llm' resource")
    dev.add_argument("--store", default="memory", help="store URL (memory, sqlite:///file.db, http://host:port)")
    dev.add_argument("--n-runners", type=int, default=1, help="runner processes (1 = in-process)")
    dev.add_argument("--concurrency", type=int, default=1, help="rollouts in flight per runner")
    dev.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    dev.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    dev.add_argument("--rollout-timeout", type=float, default=None, help="per-rollout time limit (watchdog)")
    dev.add_argument("--json", action="store_true", help="also print the summary as JSON")
    dev.set_defaults(func=_cmd_dev)

    runner = commands.add_parser("runner", help="serve an agent: take rollouts from a store until stopped")
    runner.add_argument("agent", help="module:attribute of an Agent or @rollout function")
    runner.add_argument("--store", required=True, help="store URL (http://host:port, sqlite:///file.db, postgresql://…)")
    runner.add_argument("--concurrency", type=int, default=1, help="rollouts in flight")
    runner.add_argument("--max-rollouts", type=int, default=None, help="stop after this many")
    runner.add_argument("--worker-id", default=None, help="name shown in the dashboard")
    runner.set_defaults(func=_cmd_runner)

    rollouts = commands.add_parser("rollouts", help="inspect rollouts in a store")
    rollout_commands = rollouts.add_subparsers(dest="rollouts_command", metavar="ACTION", required=True)
    listing = rollout_commands.add_parser("list", help="a table of rollouts")
    listing.add_argument("--store", required=True, help="store URL")
    listing.add_argument("--status", action="append", help="filter by status (repeatable)")
    listing.add_argument("--mode", choices=["train", "val", "test"])
    listing.add_argument("--sort", default="enqueue_time",
                         choices=["enqueue_time", "start_time", "end_time", "rollout_id", "status", "reward"])
    listing.add_argument("--ascending", action="store_true", help="oldest first (default: newest first)")
    listing.add_argument("--limit", type=int, default=50)
    listing.add_argument("--offset", type=int, default=0)
    listing.add_argument("--json", action="store_true", help="print JSON instead of a table")
    listing.set_defaults(func=_cmd_rollouts_list)
    show = rollout_commands.add_parser("show", help="one rollout with its attempts and spans, as JSON")
    show.add_argument("rollout_id")
    show.add_argument("--store", required=True, help="store URL")
    show.set_defaults(func=_cmd_rollouts_show)

    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            if exc.name and not exc.name.startswith("agentgrad"):
                logging.getLogger(__name__).debug("commands of %s unavailable: %s", module_name, exc)
            continue
        module.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from agentgrad.errors import AgentGradError

    try:
        return int(args.func(args) or 0)
    except AgentGradError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
