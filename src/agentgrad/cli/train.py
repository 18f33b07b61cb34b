"""``agentgrad train`` and ``agentgrad eval``: train your own agent's model, or score it, in one command.

``train`` starts everything a run needs, embedded: a SQLite store in the output directory (or the
one ``--store`` names), the local engine and its OpenAI-compatible server, the capture proxy and
runner processes serving the agent; then it runs GRPO with the settings of ``GRPOConfig`` (defaults,
then ``--config FILE``, then flags; the resolved settings are written to ``config.yaml`` in the
output directory), exports the best and the final model as Hugging Face directories, and prints a
summary. It exits non-zero, saying why, when nothing could be trained.

``--algorithm sft`` runs rejection-sampling SFT with the same wiring instead: the local model
attempts every task ``--group-size`` times, the rollouts with reward ≥ ``--min-reward`` are kept,
and the model is trained on them with NLL (``--steps`` steps of ``--batch-size`` sequences, the
``--train.*`` settings), ``--iterations`` times; the final model is exported to ``output_dir/model``.
``--algorithm evaluate`` is ``agentgrad eval`` on ``--tasks`` with the local model. ``--algorithm
apo`` optimizes a prompt, not a model: it needs critic and editor LLMs, so it is ``agentgrad apo``.

``eval`` runs every task once, greedily, against a model directory, a training run or checkpoint
(exported first), the tiny model, or any OpenAI-compatible server (``--upstream``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgrad.config import add_dataclass_arguments

#: Flags the commands define themselves; GRPOConfig's own flags are added from its fields.
_TRACKERS = ("tensorboard", "wandb", "mlflow")
_ALGORITHMS = ("grpo", "sft", "evaluate", "apo")

#: The GRPOConfig settings ``--algorithm sft`` reads (the others are GRPO's alone).
_SFT_SETTINGS = ("--steps (NLL steps per iteration), --batch-size (sequences per step), --group-size "
                 "(rollouts per task per iteration), --train.*, --agent-match, --rollout-timeout-seconds, "
                 "--batch-timeout, --output-dir, --resume, --run-id")


def add_commands(commands: Any) -> None:
    """Register ``train`` and ``eval``."""
    from agentgrad.algorithms.grpo import GRPOConfig  # light: no torch at import

    train = commands.add_parser(
        "train", help="train an agent's model (GRPO, or SFT): store, engine, proxy and runners included",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_run_arguments(train)
    train.add_argument("--algorithm", choices=_ALGORITHMS, default="grpo",
                       help="grpo (default); sft: rejection-sampling fine-tuning (reads only the settings named "
                            "below); evaluate: `agentgrad eval` on --tasks with the local model (no settings); "
                            "apo: see `agentgrad apo`")
    train.add_argument("--val", help="validation tasks, run greedily every --val-every steps (same formats; grpo only)")
    train.add_argument("--config", help="YAML or TOML file of GRPO settings (the flags below override it)")
    train.add_argument("--upstream", default=None,
                       help="grpo: an AgentGrad model server started separately (`agentgrad serve-model DIR` of the "
                            "same --model, on this machine or a shared filesystem); new weights are published to it "
                            "over /v1/update_weights instead of an engine started here")
    train.add_argument("--tracker", action="append", choices=_TRACKERS, default=None,
                       help="also log metrics to this experiment tracker "
                            "(repeatable; pip install 'agentgrad[trackers]'; grpo only)")
    sft = train.add_argument_group("SFT settings (--algorithm sft only)")
    sft.add_argument("--iterations", type=int, default=1,
                     help="rounds of sample → select → train → publish (default 1)")
    sft.add_argument("--min-reward", type=float, default=1.0,
                     help="keep rollouts whose reward is at least this (default 1.0)")
    add_dataclass_arguments(train.add_argument_group(
        "GRPO settings (GRPOConfig; defaults shown)",
        f"All apply to --algorithm grpo. --algorithm sft reads {_SFT_SETTINGS}; --algorithm evaluate none."),
        GRPOConfig)
    train.set_defaults(func=_cmd_train)

    evaluate = commands.add_parser(
        "eval", help="run every task once, greedily, and print success and reward",
        description="Score an agent on a task set with a model directory, a training run or checkpoint "
                    "(exported first), the tiny model, or an OpenAI-compatible server (--upstream).")
    _add_run_arguments(evaluate, model_required=False)
    evaluate.add_argument("--upstream", help="an OpenAI-compatible base URL to evaluate instead of a local model")
    evaluate.add_argument("--served-model", default="default", help="model name to ask --upstream for")
    evaluate.add_argument("--api-key", default=None, help="API key for --upstream")
    evaluate.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    evaluate.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    evaluate.add_argument("--json", action="store_true", help="also print the report as JSON")
    evaluate.set_defaults(func=_cmd_eval)


def _add_run_arguments(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    parser.add_argument("agent", metavar="AGENT",
                        help="module:function (a @rollout function) or module:Class (an Agent subclass)")
    parser.add_argument("--model", required=model_required,
                        help="'tiny' or a local Hugging Face causal-LM directory" +
                             ("" if model_required else " (or a training run or checkpoint directory)"))
    parser.add_argument("--tasks", required=True, help="tasks: JSONL, JSON array, CSV or Parquet")
    parser.add_argument("--store", default=None,
                        help="store URL (default: a SQLite file in the output directory)")
    parser.add_argument("--runners", type=int, default=2,
                        help="runner processes (0: started elsewhere with `agentgrad runner --store … --proxy …`)")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts in flight per runner")
    parser.add_argument("--llm-resource", default="llm", help="the name of the LLM resource the agent asks for")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for the engine and the trainer (1 is fastest on a small shared CPU)")


def resolve_model(name: str) -> Path:
    """``tiny`` → the built tiny model (built on first use); anything else is a directory."""
    if name == "tiny":
        from agentgrad.demo.tiny import ensure_tiny_model

        return Path(ensure_tiny_model())
    return Path(name).expanduser()


@dataclass
class _Run:
    """What a training run starts from, every input already checked."""

    config: Any  # GRPOConfig (its flags and file also set SFT's shared settings)
    agent: Any
    tasks: list[Any]
    val_tasks: list[Any]
    model_dir: Path
    out: Path
    store_url: str


def _prepare(args: argparse.Namespace) -> _Run:
    """Read and check everything a run needs (settings, agent, task files, model) before anything
    starts, then create the output directory with the resolved ``config.yaml`` in it."""
    import torch

    from agentgrad.agents import load_agent
    from agentgrad.algorithms.grpo import GRPOConfig
    from agentgrad.config import dump, resolve
    from agentgrad.tasks import read_tasks
    from agentgrad.training.policy import check_model

    config = resolve(GRPOConfig, args.config, args)
    agent = load_agent(args.agent)
    tasks = read_tasks(args.tasks)
    val_tasks = read_tasks(args.val) if args.val else []
    model_dir = resolve_model(args.model)
    check_model(model_dir)  # a missing tokenizer or chat template is named now, not mid-run
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump(config, out / "config.yaml")
    torch.set_num_threads(args.threads)
    return _Run(config, agent, tasks, val_tasks, model_dir, out,
                args.store or f"sqlite://{(out / 'store.sqlite').resolve()}")


def _cmd_train(args: argparse.Namespace) -> int:
    from agentgrad.errors import AgentGradError

    if args.algorithm == "apo":
        raise AgentGradError(
            "`agentgrad train --algorithm apo` is not wired: APO optimizes a prompt template, not the model, and "
            "needs critic and editor LLM endpoints and a seed prompt. Use `agentgrad apo AGENT --tasks FILE "
            "--prompt TEMPLATE --critic-base-url URL --critic-model NAME` (see `agentgrad apo --help`).")
    if args.algorithm == "evaluate":
        return _cmd_eval(argparse.Namespace(**{**vars(args), "upstream": None, "temperature": 0.0,
                                               "timeout": None, "json": False}))
    if args.algorithm == "sft":
        return _train_sft(args)
    from rich.console import Console

    from agentgrad.algorithms.grpo import GRPO
    from agentgrad.algorithms.trackers import make_trackers
    from agentgrad.store import open_store
    from agentgrad.trainer import Trainer
    from agentgrad.training.local import LocalPolicy

    console = Console()
    run = _prepare(args)
    config, agent, tasks, val_tasks = run.config, run.agent, run.tasks, run.val_tasks
    model_dir, out = run.model_dir, run.out
    trackers = make_trackers(args.tracker or [], out, config.run_id)
    store = open_store(run.store_url)
    console.print(f"training [bold]{args.agent}[/] on {model_dir} · {len(tasks)} train / {len(val_tasks)} val tasks · "
                  f"output {out}")
    try:
        if args.upstream:  # the engine runs elsewhere: new weights go to it over HTTP
            from agentgrad.training.publish import ModelServerPublisher

            grpo = GRPO(model_dir, config, trackers=trackers,
                        publisher=ModelServerPublisher(args.upstream, out / "published"))
            result = _fit_on_upstream(args, grpo, agent, tasks, val_tasks, store, console)
        else:
            with LocalPolicy(model_dir, device=args.device).serving(store) as policy:
                trainer = Trainer(store, algorithm=GRPO(model_dir, config, trackers=trackers), policy=policy,
                                  n_runners=args.runners, concurrency=args.concurrency,
                                  llm_resource=args.llm_resource, console=console)
                result = trainer.fit(agent, tasks, val_tasks)
    except RuntimeError as exc:  # GRPO's "nothing could be trained" (every batch empty) and its kin
        console.print(f"[red]error:[/] {exc}")
        return 1
    finally:
        store.close()
    summary = {
        "steps": result.steps, "validation": result.validation, "best_step": result.best_step,
        "best_score": result.best_score, "model": str(out / "model"),
        "best_model": str(out / "best") if result.best_step is not None else None,
        "config": str(out / "config.yaml"), "store": run.store_url,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.rule("[bold]agentgrad train")
    if result.validation:
        first, last = result.validation[0][1], result.validation[-1][1]
        console.print(f"greedy validation on {len(val_tasks)} tasks: [bold]{first:.3f} → {last:.3f}[/] "
                      f"(best {result.best_score:.3f} at step {result.best_step})")
    console.print(f"{result.steps} GRPO steps · final model {out / 'model'} · best model {summary['best_model']}")
    console.print(f"serve it:     agentgrad serve-model {out / 'model'}")
    console.print(f"dashboard:    agentgrad dashboard --store {summary['store']}")
    if result.steps == 0:
        console.print("[red]error:[/] no step trained (see the messages above)")
        return 1
    return 0


def _fit_on_upstream(args: argparse.Namespace, grpo: Any, agent: Any, tasks: list[Any], val_tasks: list[Any],
                     store: Any, console: Any) -> Any:
    """GRPO against an AgentGrad model server started elsewhere (``agentgrad serve-model`` of the
    same model): a capture proxy here in front of it; the trainer here, publishing to it."""
    from agentgrad.errors import InvalidInputError
    from agentgrad.http.transport import request_json
    from agentgrad.proxy import LLMProxy
    from agentgrad.trainer import Trainer
    from agentgrad.types import LLM

    v1 = args.upstream.rstrip("/").removesuffix("/v1") + "/v1"
    try:
        served = request_json("GET", f"{v1}/models", timeout=10).json()["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise InvalidInputError(f"--upstream {args.upstream}: no OpenAI-compatible model server answers there "
                                f"({type(exc).__name__}: {exc})") from None
    with LLMProxy(store, v1) as proxy:
        trainer = Trainer(store, algorithm=grpo, proxy=proxy, n_runners=args.runners, concurrency=args.concurrency,
                          llm_resource=args.llm_resource, console=console)
        return trainer.fit(agent, tasks, val_tasks, resources={args.llm_resource: LLM(endpoint=v1, model=served)})


def _train_sft(args: argparse.Namespace) -> int:
    """``--algorithm sft``: rejection-sampling SFT with the same embedded policy and runners as GRPO."""
    from rich.console import Console

    from agentgrad.algorithms.sft import SFT, SelectionCriteria
    from agentgrad.errors import AgentGradError
    from agentgrad.store import open_store
    from agentgrad.trainer import Trainer
    from agentgrad.training.export import export_model
    from agentgrad.training.local import LocalPolicy
    from agentgrad.types import RolloutConfig

    console = Console()
    if args.iterations < 1:
        raise SystemExit("--iterations must be ≥ 1")
    run = _prepare(args)
    config, agent, tasks = run.config, run.agent, run.tasks
    model_dir, out, store_url = run.model_dir, run.out, run.store_url
    store = open_store(store_url)
    run_id = "sft" if config.run_id == "grpo" else config.run_id  # GRPOConfig's default names GRPO
    console.print(f"SFT of [bold]{args.agent}[/] on {model_dir} · {len(tasks)} tasks × {config.group_size} samples · "
                  f"output {out}")
    try:
        with LocalPolicy(model_dir, device=args.device).serving(store) as policy:
            publisher = _KeepTrainer(policy.publisher())
            sft = SFT(model_dir, criteria=SelectionCriteria(min_reward=args.min_reward, agent_match=config.agent_match),
                      train_config=config.train, iterations=args.iterations, samples_per_task=config.group_size,
                      steps=config.steps, batch_size=config.batch_size, publisher=publisher,
                      checkpoint_dir=out / "checkpoints" if config.resume else None,
                      rollout_config=RolloutConfig(timeout_seconds=config.rollout_timeout_seconds),
                      wait_timeout=config.batch_timeout, run_id=run_id)
            trainer = Trainer(store, algorithm=sft, policy=policy, n_runners=args.runners,
                              concurrency=args.concurrency, llm_resource=args.llm_resource, console=console)
            result = trainer.fit(agent, tasks)
            if publisher.trainer is None:
                raise AgentGradError("SFT published no model")
            model = export_model(publisher.trainer, out / "model")
    except RuntimeError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    finally:
        store.close()
    summary = {"algorithm": "sft", "iterations": len(result.versions), "min_reward": args.min_reward,
               "samples": result.samples,
               "steps": len(result.history), "versions": result.versions,
               "funnels": [funnel.describe() for funnel in result.funnels], "model": str(model),
               "config": str(out / "config.yaml"), "store": store_url}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.rule("[bold]agentgrad train --algorithm sft")
    console.print(f"{len(result.history)} SFT steps on {sum(result.samples)} sequence(s) · final model {model}")
    console.print(f"serve it:     agentgrad serve-model {model}")
    console.print(f"dashboard:    agentgrad dashboard --store {store_url}")
    return 0


class _KeepTrainer:
    """A publisher that remembers the policy trainer it published, so that it can be exported after."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.trainer = inner, None

    def publish(self, trainer: Any) -> Any:
        self.trainer = trainer
        return self.inner.publish(trainer)


def _cmd_eval(args: argparse.Namespace) -> int:
    from agentgrad.agents import load_agent
    from agentgrad.store import open_store
    from agentgrad.tasks import read_tasks
    from agentgrad.trainer import Trainer
    from agentgrad.types import LLM

    if (args.model is None) == (args.upstream is None):
        raise SystemExit("eval needs exactly one of --model (a local model, run or checkpoint) and --upstream URL")
    agent = load_agent(args.agent)
    tasks = read_tasks(args.tasks)
    with tempfile.TemporaryDirectory(prefix="agentgrad-eval-") as work:
        store = open_store(args.store or f"sqlite://{Path(work) / 'store.sqlite'}")
        try:
            if args.upstream:
                llm = LLM(endpoint=args.upstream, model=args.served_model, api_key=args.api_key,
                          sampling={"temperature": args.temperature})
                report = Trainer(store, n_runners=args.runners, concurrency=args.concurrency).dev(
                    agent, tasks, {args.llm_resource: llm}, timeout=args.timeout)
            else:
                report = _eval_local(args, agent, tasks, store, Path(work))
        finally:
            store.close()
    if args.json:
        print(json.dumps(report.as_dict()))
    return 0 if report.succeeded else 1


def _eval_local(args: argparse.Namespace, agent: Any, tasks: list[Any], store: Any, work: Path) -> Any:
    from agentgrad.trainer import Trainer
    from agentgrad.training.local import LocalPolicy

    model_dir = resolve_model(args.model)
    if not (model_dir / "config.json").is_file():  # a training run or a checkpoint: export it first
        from agentgrad.training.export import export_model

        model_dir = export_model(model_dir, work / "model")
    with LocalPolicy(model_dir, device=args.device).serving(store) as policy:
        trainer = Trainer(store, policy=policy, n_runners=args.runners, concurrency=args.concurrency,
                          llm_resource=args.llm_resource)
        return trainer.dev(agent, tasks, {args.llm_resource: policy.llm(temperature=args.temperature)},
                           timeout=args.timeout)
