"""``agentgrad dev`` and ``agentgrad runner``: run an agent on tasks, or serve it to a store."""

from __future__ import annotations

import argparse
import json
import logging
import signal
from typing import TYPE_CHECKING, Any

from agentgrad.agents import Agent, load_agent
from agentgrad.cli.named_models import (
    MODEL_HELP,
    add_engine_dtype_argument,
    add_prefix_cache_arguments,
    engine_flags_given,
    engine_keywords,
)
from agentgrad.errors import AgentGradError
from agentgrad.tasks import read_tasks

if TYPE_CHECKING:
    from agentgrad.algorithms.baseline import EvaluationReport
    from agentgrad.types import RolloutConfig

#: What every command's AGENT argument accepts.
AGENT_HELP = (
    "module:Class (an Agent or agentlightning LitAgent subclass, created with no arguments), "
    "module:instance or module:function (a @rollout function); a file path works as the module"
)
#: The help of ``--llm-endpoint`` where the command runs the agent on an endpoint served elsewhere.
LLM_ENDPOINT_HELP = (
    "OpenAI-compatible base URL handed to the agent as its LLM resource; without --proxy, a capture "
    "proxy started here in front of it records every call"
)
#: The help of ``--llm-resource`` where the command publishes the agent's LLM.
LLM_RESOURCE_HELP = (
    "the name of the LLM resource the agent reads (default: the agent's llm_resource — main_llm for "
    "an agentlightning LitAgent — else llm)"
)


def add_commands(commands: Any) -> None:
    """Register ``dev`` and ``runner``."""
    dev = commands.add_parser(
        "dev", help="run every task once with an agent (on a local model or an endpoint) and print a summary"
    )
    dev.add_argument("agent", help=AGENT_HELP)
    dev.add_argument(
        "--tasks", required=True, help="tasks: JSONL (one JSON value per line), a JSON array, CSV or Parquet"
    )
    dev.add_argument("--llm-endpoint", help=LLM_ENDPOINT_HELP)
    dev.add_argument(
        "--model",
        help=f"without --llm-endpoint or --proxy: a local model to run the agent on — {MODEL_HELP} (or a "
        "training run or checkpoint) — served here by the embedded engine behind the capture proxy; with "
        "one: the model name to ask the endpoint for",
    )
    dev.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the server's own)")
    dev.add_argument("--device", default="cpu", help="with a local --model: cpu, cuda, cuda:N or auto")
    add_engine_dtype_argument(dev, scope="with a local --model: ")
    add_prefix_cache_arguments(dev, "with a local --model: ")
    dev.add_argument("--api-key", default=None, help="API key for the LLM resource")
    dev.add_argument("--llm-resource", default=None, metavar="NAME", help=LLM_RESOURCE_HELP)
    dev.add_argument(
        "--proxy",
        default=None,
        metavar="URL",
        help="the capture proxy (agentgrad proxy): every LLM call goes through it and is recorded",
    )
    dev.add_argument("--store", default="memory", help="store URL (memory, path/to/file.db, http://host:port)")
    dev.add_argument(
        "--n-runners",
        type=int,
        default=1,
        help="runner processes (1 = in-process; 0 = runners started elsewhere serve the store)",
    )
    dev.add_argument("--concurrency", type=int, default=1, help="rollouts in flight per runner")
    dev.add_argument("--limit", type=int, default=0, help="only the first N tasks")
    dev.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    dev.add_argument("--rollout-timeout", type=float, default=None, help="per-rollout time limit (watchdog)")
    dev.add_argument("--json", action="store_true", help="also print the summary as JSON")
    dev.set_defaults(func=_cmd_dev)

    runner = commands.add_parser("runner", help="serve an agent: take rollouts from a store until stopped")
    runner.add_argument("agent", help=AGENT_HELP)
    runner.add_argument("--store", required=True, help="store URL (http://host:port, path/to/file.db, postgresql://…)")
    runner.add_argument(
        "--proxy",
        default=None,
        metavar="URL",
        help="the capture proxy: each attempt's LLM endpoints are rewritten through it, and its "
        "calls are flushed into the store before the attempt is reported",
    )
    runner.add_argument(
        "--llm-resource",
        default=None,
        metavar="NAME",
        help="with --proxy: the name of the LLM resource an attempt gets when its resources hold "
        "none (default: the agent's llm_resource — main_llm for an agentlightning LitAgent — "
        "else llm); LLM resources it has keep their names",
    )
    runner.add_argument("--concurrency", type=int, default=1, help="rollouts in flight")
    runner.add_argument("--max-rollouts", type=int, default=None, help="stop after this many")
    runner.add_argument("--worker-id", default=None, help="name shown in the dashboard")
    runner.set_defaults(func=_cmd_runner)


def _cmd_dev(args: argparse.Namespace) -> int:
    from agentgrad.trainer import Trainer
    from agentgrad.types import RolloutConfig

    local_model = bool(args.model) and not (args.llm_endpoint or args.proxy)
    engine_flags = engine_flags_given(args)
    if engine_flags and not local_model:
        raise AgentGradError(
            f"{' and '.join(engine_flags)} set{'s' if len(engine_flags) == 1 else ''} up the engine a local --model "
            "runs on; with --llm-endpoint or --proxy the model is served elsewhere"
        )
    agent = load_cli_agent(args.agent)
    tasks = read_tasks(args.tasks)
    if args.limit:
        tasks = tasks[: args.limit]
    config = RolloutConfig(timeout_seconds=args.rollout_timeout) if args.rollout_timeout else None
    sampling = {} if args.temperature is None else {"temperature": args.temperature}
    if local_model:
        report = _dev_on_local_model(args, agent, tasks, sampling, config)
    else:  # the Trainer records the calls through --proxy, or a proxy it starts in front of --llm-endpoint
        name, resources = llm_resource_of(args, default=llm_resource_name(None, agent), sampling=sampling)
        trainer = Trainer(
            args.store, n_runners=args.n_runners, concurrency=args.concurrency, proxy=args.proxy, llm_resource=name
        )
        report = trainer.dev(agent, tasks, resources, timeout=args.timeout, config=config)
    if report.lowest is not None and not args.json:
        print(_whole_rollout_hint(args.store, report.lowest.rollout_id))
    if args.json:
        print(json.dumps(report.as_dict()))
    return 0 if report.succeeded else 1


def _whole_rollout_hint(store: str, rollout_id: str) -> str:
    """How to read a rollout of the summary whole: ``rollouts show``, once the store outlives the run."""
    if store == "memory":
        return "  (to read rollouts whole, keep them: --store dev.db, then agentgrad rollouts show ID --store dev.db)"
    return f"  the whole rollout: agentgrad rollouts show {rollout_id} --store {store}"


def _dev_on_local_model(
    args: argparse.Namespace, agent: Agent, tasks: list[Any], sampling: dict[str, Any], config: RolloutConfig | None
) -> EvaluationReport:
    """``dev --model`` with no endpoint: the agent run on that model, served here."""
    from agentgrad.cli.local_model import run_on_local_model
    from agentgrad.store import open_store

    store = open_store(args.store)
    try:
        return run_on_local_model(
            args.model,
            agent,
            tasks,
            store,
            llm_resource=llm_resource_name(args.llm_resource, agent),
            sampling=sampling,
            engine=engine_keywords(args),
            runners=args.n_runners,
            concurrency=args.concurrency,
            timeout=args.timeout,
            config=config,
        )
    finally:
        store.close()


def load_cli_agent(spec: str) -> Agent:
    """:func:`~agentgrad.agents.load_agent`, with ``import agentlightning`` resolving to AgentGrad's
    compatibility module when no real one is installed (so an Agent Lightning agent's module loads
    unchanged; runner processes it starts do the same)."""
    from agentgrad.compat import install_alias

    install_alias()
    return load_agent(spec)


def llm_resource_name(flag: str | None, agent: Agent) -> str:
    """``--llm-resource`` when given, else the name the agent reads (``Agent.llm_resource``), else ``llm``."""
    return flag or agent.llm_resource or "llm"


def llm_resource_of(
    args: argparse.Namespace, default: str = "llm", sampling: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The LLM resource that ``--llm-endpoint`` / ``--proxy`` / ``--llm-resource`` / ``--model`` /
    ``--api-key`` describe, with ``sampling``, as ``(name, {name: LLM})`` (no item when neither URL
    is given), each URL checked to answer first; ``default`` names it when ``--llm-resource`` does not."""
    from agentgrad.types import LLM

    name = args.llm_resource or default
    if args.llm_resource and not (args.llm_endpoint or args.proxy):
        raise AgentGradError("--llm-resource names the LLM resource of --llm-endpoint or --proxy; give one of them")
    if args.proxy:
        check_reachable(args.proxy, "--proxy", path="/health")
    if args.llm_endpoint:
        check_reachable(args.llm_endpoint, "--llm-endpoint", path="/models", api_key=args.api_key)
    endpoint = args.llm_endpoint or args.proxy  # without an endpoint, runners point it at the proxy
    if not endpoint:
        return name, {}
    llm = LLM(endpoint=endpoint, model=args.model or "default", api_key=args.api_key, sampling=sampling or {})
    return name, {name: llm}


def check_reachable(url: str, flag: str, *, path: str, api_key: str | None = None, timeout: float = 10.0) -> None:
    """Fail now, naming ``url``, when nothing answers there (instead of every rollout failing on a
    bare "Connection error"); an HTTP error status only warns (the server may not serve ``path``)."""
    from agentgrad.http.transport import request_json

    if not url.startswith(("http://", "https://")):
        raise AgentGradError(f"{flag} {url!r} is not an http:// or https:// URL")
    probe = url.rstrip("/")
    if path == "/health":
        probe = probe.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        reply = request_json("GET", probe + path, headers=headers, timeout=timeout)
    except (OSError, ValueError) as exc:
        raise AgentGradError(
            f"{flag} {url}: cannot reach it ({type(exc).__name__}: {exc}) — is the server "
            "running, and is the URL right?"
        ) from None
    if reply.status >= 400:
        logging.getLogger("agentgrad").warning(
            "%s %s: GET %s answered HTTP %d; running anyway", flag, url, probe + path, reply.status
        )


def _cmd_runner(args: argparse.Namespace) -> int:
    from agentgrad.runner import Runner, prepare_runner_process
    from agentgrad.store import open_store

    agent = load_cli_agent(args.agent)
    if args.llm_resource and not args.proxy:
        raise AgentGradError("--llm-resource names the LLM resource the runner points at --proxy; give --proxy URL")
    hook = None
    if args.proxy:
        check_reachable(args.proxy, "--proxy", path="/health")
        name = llm_resource_name(args.llm_resource, agent)
        if name != "llm":  # runs before the Runner's own proxy hook, which then finds an LLM to keep
            from agentgrad.proxy.hooks import ProxyResourcesHook

            hook = ProxyResourcesHook(args.proxy, llm_resource=name)
    store = open_store(args.store, watchdog=False)
    runner = Runner(
        agent,
        store,
        concurrency=args.concurrency,
        max_rollouts=args.max_rollouts,
        worker_id=args.worker_id,
        llm_proxy_url=args.proxy,
        resources_hook=hook,
    )
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: runner.stop())
    prepare_runner_process()  # a store outage is logged, its start and its end; agents' clients share TLS contexts
    logging.getLogger("agentgrad").info("runner %s serving %s from %s", runner.worker_id, args.agent, args.store)
    through = f", LLM calls through the proxy {args.proxy}" if args.proxy else ""
    print(f"runner {runner.worker_id} taking rollouts from {args.store}{through} (Ctrl-C to stop)", flush=True)
    try:
        stats = runner.run()
    finally:
        store.close()
    print(f"runner stopped: {stats.succeeded} succeeded, {stats.failed} failed, {stats.handed_back} handed back")
    return 0
