"""``agentgrad apo``, ``agentgrad sft`` and ``agentgrad export`` (loaded by :mod:`agentgrad.cli`).

Heavy modules (torch, pyarrow, the algorithms themselves) are imported inside the commands, so
``agentgrad --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def _add_selection_args(parser: argparse.ArgumentParser) -> None:
    """The selection filters shared by ``sft`` and ``export`` (see ``SelectionCriteria``)."""
    parser.add_argument("--store", required=True, help="store URL (path/to/file.db, http://host:port, …)")
    parser.add_argument(
        "--min-reward", type=float, default=1.0, help="keep rollouts whose final reward is at least this (default 1.0)"
    )
    parser.add_argument("--any-reward", action="store_true", help="ignore rewards (overrides --min-reward)")
    parser.add_argument("--agent-match", default=None, help="regex on agent names; only matching LLM calls are kept")
    parser.add_argument(
        "--mode",
        action="append",
        choices=["train", "val", "test"],
        help="rollout modes to use (repeatable; default: train)",
    )
    parser.add_argument("--since", type=float, default=None, help="only rollouts that ended after this epoch time")
    parser.add_argument("--newest", type=int, default=None, help="only the N most recently finished rollouts")
    parser.add_argument("--no-dedupe", action="store_true", help="keep exact duplicates")


def _criteria(args: argparse.Namespace) -> Any:
    from agentgrad.algorithms.sft import SelectionCriteria

    return SelectionCriteria(
        min_reward=None if args.any_reward else args.min_reward,
        agent_match=args.agent_match,
        modes=tuple(args.mode or ("train",)),
        since=args.since,
        newest=args.newest,
        dedupe=not args.no_dedupe,
    )


def _cmd_export(args: argparse.Namespace) -> int:
    from agentgrad.algorithms.sft import export_samples, select_chat_samples
    from agentgrad.store import open_store

    with open_store(args.store, watchdog=False, existing=True) as store:
        samples, funnel = select_chat_samples(store, _criteria(args))
    path = export_samples(samples, args.output, args.format)
    print(f"selection: {funnel.describe()}")
    print(f"wrote {len(samples)} conversation(s) to {path}")
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    from agentgrad.algorithms.base import AlgorithmContext
    from agentgrad.algorithms.sft import SFT, SaveToDirectory
    from agentgrad.cli.named_models import resolve_model
    from agentgrad.store import open_store
    from agentgrad.training import LoraSettings, TrainConfig

    config = TrainConfig(lr=args.lr, lora=LoraSettings(r=args.lora_r, alpha=2 * args.lora_r) if args.lora_r else None)
    sft = SFT(
        resolve_model(args.model_dir),
        criteria=_criteria(args),
        train_config=config,
        steps=args.steps,
        batch_size=args.batch_size,
        publisher=SaveToDirectory(args.output),
        checkpoint_dir=args.checkpoint_dir,
        run_id=args.run_id,
    )
    with open_store(args.store, watchdog=False, existing=True) as store:
        result = sft.run(AlgorithmContext(store=store))
    print(f"trained {len(result.history)} step(s) on {result.samples[-1]} sequence(s); weights: {result.versions[-1]}")
    return 0


def _cmd_apo(args: argparse.Namespace) -> int:
    from agentgrad.algorithms.apo import APO, ChatEndpoint
    from agentgrad.cli.run import llm_resource_name, llm_resource_of, load_cli_agent
    from agentgrad.tasks import read_tasks
    from agentgrad.trainer import Trainer
    from agentgrad.types import PromptTemplate, RolloutConfig

    prompt_text = Path(args.prompt[1:]).read_text() if args.prompt.startswith("@") else args.prompt
    critic_key = args.critic_api_key or os.environ.get("AGENTGRAD_CRITIC_API_KEY") or os.environ.get("OPENAI_API_KEY")
    critic = ChatEndpoint(
        base_url=args.critic_base_url,
        model=args.critic_model,
        api_key=critic_key,
        temperature=args.temperature,
        concurrency=args.concurrency,
        retries=args.retries,
    )
    editor = ChatEndpoint(
        base_url=args.editor_base_url or args.critic_base_url,
        model=args.editor_model or args.critic_model,
        api_key=args.editor_api_key or critic_key,
        temperature=args.temperature,
        concurrency=args.concurrency,
        retries=args.retries,
    )
    apo = APO(
        critic,
        editor,
        prompt_name=args.prompt_name,
        variables=args.variable or None,
        beam_width=args.beam_width,
        branch_factor=args.branch_factor,
        rounds=args.rounds,
        train_batch_size=args.train_batch_size,
        val_batch_size=args.val_batch_size,
        run_id=args.run_id,
        rollout_config=RolloutConfig(timeout_seconds=args.rollout_timeout) if args.rollout_timeout else None,
    )
    agent = load_cli_agent(args.agent)
    name, llm = llm_resource_of(args, default=llm_resource_name(None, agent))
    resources: dict[str, Any] = {args.prompt_name: PromptTemplate(template=prompt_text, engine=args.engine), **llm}
    train = read_tasks(args.tasks)
    val = read_tasks(args.val_tasks) if args.val_tasks else train
    trainer = Trainer(
        args.store,
        n_runners=args.n_runners,
        concurrency=args.runner_concurrency,
        algorithm=apo,
        proxy=args.proxy,  # without one, the Trainer records the calls through a proxy before --llm-endpoint
        llm_resource=name,
    )
    result = trainer.fit(agent, train, val, resources=resources)
    print(f"seed score {result.seed.score:.3f} → best score {result.best.score:.3f} ({result.best.resources_id})")
    if args.output:
        Path(args.output).write_text(result.best.template.template)
        print(f"best prompt written to {args.output}")
    else:
        print("best prompt:\n" + result.best.template.template)
    return 0


def add_commands(commands: Any) -> None:
    """Register ``apo``, ``sft`` and ``export`` on the main CLI's sub-parsers."""
    from agentgrad.cli.named_models import MODEL_HELP
    from agentgrad.cli.run import AGENT_HELP, LLM_ENDPOINT_HELP, LLM_RESOURCE_HELP

    apo = commands.add_parser(
        "apo",
        help="optimize an agent's prompt template with critic/editor LLMs (beam search)",
        description="Beam search over prompt templates: rollouts → critique → edits → validation. "
        "Critic and editor are any OpenAI-compatible endpoint. Re-running with the same "
        "--store and --run-id resumes.",
    )
    apo.add_argument("agent", help=AGENT_HELP + "; the agent reads a PromptTemplate resource")
    apo.add_argument("--tasks", required=True, help="train tasks (JSONL or JSON array)")
    apo.add_argument("--val-tasks", help="validation tasks (default: the train tasks)")
    apo.add_argument("--prompt", required=True, help="the seed prompt template, or @file to read it from a file")
    apo.add_argument("--engine", choices=["f-string", "jinja"], default="f-string", help="template syntax")
    apo.add_argument("--prompt-name", default="prompt_template", help="resources item name of the prompt")
    apo.add_argument(
        "--variable",
        action="append",
        help="a variable the agent supplies to the template (repeatable; default: the seed's)",
    )
    apo.add_argument(
        "--critic-base-url", required=True, help="OpenAI-compatible base URL, e.g. https://api.openai.com/v1"
    )
    apo.add_argument("--critic-model", required=True, help="model name for the critic")
    apo.add_argument("--critic-api-key", help="API key (default: $AGENTGRAD_CRITIC_API_KEY, then $OPENAI_API_KEY)")
    apo.add_argument("--editor-base-url", help="editor base URL (default: the critic's)")
    apo.add_argument("--editor-model", help="editor model (default: the critic's)")
    apo.add_argument("--editor-api-key", help="editor API key (default: the critic's)")
    apo.add_argument("--temperature", type=float, default=0.7, help="critic/editor sampling temperature")
    apo.add_argument("--concurrency", type=int, default=4, help="calls in flight per critic/editor endpoint")
    apo.add_argument("--retries", type=int, default=3, help="retries on transport errors, 429 and 5xx")
    apo.add_argument("--beam-width", type=int, default=2)
    apo.add_argument("--branch-factor", type=int, default=2, help="edits proposed per beam prompt per round")
    apo.add_argument("--rounds", type=int, default=3)
    apo.add_argument("--train-batch-size", type=int, default=8, help="rollouts the critic reads per beam prompt")
    apo.add_argument("--val-batch-size", type=int, default=16, help="validation tasks per candidate")
    apo.add_argument("--run-id", default="apo", help="names the run; the same id resumes it")
    apo.add_argument("--store", default="memory", help="store URL (a file such as apo.db to be able to resume)")
    apo.add_argument("--n-runners", type=int, default=1, help="runner processes (1 = in-process)")
    apo.add_argument("--runner-concurrency", type=int, default=4, help="rollouts in flight per runner")
    apo.add_argument("--rollout-timeout", type=float, help="per-rollout time limit (seconds)")
    apo.add_argument("--llm-endpoint", help=LLM_ENDPOINT_HELP)
    apo.add_argument(
        "--proxy",
        default=None,
        metavar="URL",
        help="the capture proxy (agentgrad proxy): every LLM call of the agent goes through it and is "
        "recorded (without --llm-endpoint, the proxy's upstream is the agent's LLM)",
    )
    apo.add_argument("--llm-resource", default=None, metavar="NAME", help=LLM_RESOURCE_HELP)
    apo.add_argument("--model", help="model name of the agent's LLM resource")
    apo.add_argument("--api-key", help="API key of the agent's LLM resource")
    apo.add_argument("--output", help="write the best prompt to this file")
    apo.set_defaults(func=_cmd_apo)

    sft = commands.add_parser(
        "sft",
        help="fine-tune a model on the store's successful traces (rejection sampling)",
        description="Select stored traces by reward, agent and recency, train with NLL (LoRA or full) and "
        "write the merged weights as a Hugging Face model directory under --output.",
    )
    _add_selection_args(sft)
    sft.add_argument(
        "--model-dir",
        required=True,
        help=f"the policy that produced the traces: {MODEL_HELP}",
    )
    sft.add_argument("--output", required=True, help="directory for the trained weights (step-N/ subdirectories)")
    sft.add_argument("--steps", type=int, default=50, help="optimizer steps")
    sft.add_argument("--batch-size", type=int, default=16, help="sequences per optimizer step")
    sft.add_argument(
        "--lr",
        type=float,
        default=None,
        help="learning rate (default: picked from the model's size, see docs/models.md)",
    )
    sft.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: full fine-tuning)")
    sft.add_argument("--checkpoint-dir", help="checkpoint here and resume from it")
    sft.add_argument("--run-id", default="sft", help="names the metrics of this run")
    sft.set_defaults(func=_cmd_sft)

    export = commands.add_parser(
        "export",
        help="export selected traces as chat JSONL or Parquet for external trainers",
        description="One conversation per selected LLM call (multi-turn calls folded into the last "
        "turn): messages, tools and metadata.",
    )
    _add_selection_args(export)
    export.add_argument("--format", choices=["jsonl", "parquet"], help="default: from the output suffix")
    export.add_argument("--output", required=True, help="file to write")
    export.set_defaults(func=_cmd_export)
