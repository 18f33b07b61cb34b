"""``agentgrad dev`` and ``agentgrad runner``: run an agent on tasks, or serve it to a store."""

from __future__ import annotations

import argparse
import json
import logging
import signal
from typing import Any

from agentgrad.agents import load_agent
from agentgrad.tasks import read_tasks


def add_commands(commands: Any) -> None:
    """Register ``dev`` and ``runner``."""
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
