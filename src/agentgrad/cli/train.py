"""``agentgrad train`` and ``agentgrad eval``: train your own agent's model, or score it, in one command.

``train`` starts everything a run needs, embedded: a SQLite store in the output directory (or the
one ``--store`` names), the local engine and its OpenAI-compatible server, the capture proxy and
runner processes serving the agent; then it runs GRPO with the settings of ``GRPOConfig`` (defaults,
then ``--config FILE``, then flags; the resolved settings are written to ``config.yaml`` in the
output directory), exports the best and the final model as Hugging Face directories, and prints a
summary. It exits non-zero, saying why, when nothing could be trained.

``--algorithm sft`` runs rejection-sampling SFT with the same wiring and the settings of
``SFTConfig`` instead: the local model attempts every task ``--samples-per-task`` times, the
rollouts with reward ≥ ``--min-reward`` are kept, and the model is trained on them with NLL
(``--steps`` steps of ``--batch-size`` sequences, the ``--train.*`` settings), ``--iterations``
times; with ``--val`` it is validated greedily before the first iteration and after each, the
best model exported to ``output_dir/best``; the final one goes to ``output_dir/model``.
``--test FILE`` scores held-out tasks greedily on the start model before training and on the final
and best models after (each loaded from its exported directory, as a user would serve it); the
scores are printed and written to ``summary.json``. A GRPO run also draws ``reward_curve.png``.
``--algorithm evaluate`` is ``agentgrad eval`` on ``--tasks`` with the local model. ``--algorithm
apo`` optimizes a prompt, not a model: it needs critic and editor LLMs, so it is ``agentgrad apo``.

``eval`` runs every task once, greedily, against a model directory, a training run or checkpoint
(exported first), the tiny model, or any OpenAI-compatible server (``--upstream``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgrad.cli.local_model import run_on_local_model
from agentgrad.cli.named_models import (
    MODEL_HELP,
    add_engine_dtype_argument,
    add_prefix_cache_arguments,
    engine_flags_given,
    engine_keywords,
    resolve_model,
)
from agentgrad.cli.run import (
    AGENT_HELP,
    LLM_RESOURCE_HELP,
    llm_resource_name,
    load_cli_agent,
)
from agentgrad.config import add_dataclass_arguments

#: Flags the commands define themselves; GRPOConfig's own flags are added from its fields.
_TRACKERS = ("tensorboard", "wandb", "mlflow")
_ALGORITHMS = ("grpo", "sft", "evaluate", "apo")
#: Weight files at least this large (about 5M float32 parameters) make products big enough for bf16
#: to pay on a CPU that has the instructions: :func:`_bf16_hint` points such a run at the switches.
_BF16_HINT_BYTES = 20 * 2**20


def add_commands(commands: Any) -> None:
    """Register ``train`` and ``eval``."""
    from agentgrad.algorithms.grpo import GRPOConfig  # light: no torch at import
    from agentgrad.algorithms.sft import SFTConfig

    train = commands.add_parser(
        "train",
        help="train an agent's model (GRPO, or SFT): store, engine, proxy and runners included",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_run_arguments(train)
    train.add_argument(
        "--algorithm",
        choices=_ALGORITHMS,
        default="grpo",
        help="grpo (default); sft: rejection-sampling fine-tuning (SFTConfig's settings: the "
        "shared ones and those of the SFT group); evaluate: `agentgrad eval` on --tasks with the local "
        "model (no settings); apo: see `agentgrad apo`",
    )
    train.add_argument(
        "--val",
        help="validation tasks, run greedily every --val-every steps (grpo) or after every iteration (sft); "
        "the best model is exported to OUTPUT_DIR/best",
    )
    train.add_argument(
        "--test",
        help="held-out test tasks, scored greedily on the start model before training and on the final and "
        'best models after (summary.json\'s "test"); not with --upstream or --backend tinker',
    )
    train.add_argument(
        "--config",
        help="YAML or TOML file of the algorithm's settings: GRPOConfig, or SFTConfig "
        "with --algorithm sft (the flags below override it)",
    )
    train.add_argument(
        "--upstream",
        default=None,
        help="grpo: an AgentGrad model server started separately (`agentgrad serve-model DIR` of the "
        "same --model, on this machine or a shared filesystem); new weights are published to it "
        "over /v1/update_weights instead of an engine started here",
    )
    train.add_argument(
        "--backend",
        choices=("local", "tinker"),
        default="local",
        help="where the weights train and rollouts sample: local (this process, default) or tinker "
        "(a Tinker-API server: SkyRL's Tinker server, VeRL-Tinker, hosted Tinker; "
        "pip install 'agentgrad[tinker]'; see docs/scale-out.md)",
    )
    train.add_argument("--tinker-url", default=None, metavar="URL", help="--backend tinker: the server's root URL")
    train.add_argument(
        "--tinker-base-model",
        default=None,
        metavar="NAME",
        help="--backend tinker: the model name the server serves (default: --model's absolute path)",
    )
    train.add_argument(
        "--tinker-reduction",
        choices=("sequence_mean", "sum"),
        default="sequence_mean",
        help="--backend tinker: how the server reduces token losses (SkyRL: sequence_mean; hosted "
        "Tinker: sum); advantages are scaled so the loss is AgentGrad's either way",
    )
    train.add_argument(
        "--lora-hot-swap",
        action="store_true",
        help="with --train.lora: publish each new policy by loading its adapter into the engine under a new "
        "model name instead of copying the merged weights (no weight copy, but every decoding step runs the "
        "adapter: slower rollouts on a CPU; docs/inference.md)",
    )
    train.add_argument(
        "--proxy-host",
        default="127.0.0.1",
        metavar="HOST",
        help="where the capture proxy listens: 0.0.0.0 lets runner processes on other machines "
        "use it (`agentgrad runner --proxy http://THIS_HOST:PORT`; set $AGENTGRAD_PROXY_TOKEN)",
    )
    train.add_argument(
        "--proxy-port", type=int, default=0, metavar="PORT", help="the capture proxy's port (default: a free one)"
    )
    train.add_argument(
        "--tracker",
        action="append",
        choices=_TRACKERS,
        default=None,
        help="also log metrics to this experiment tracker (repeatable; pip install 'agentgrad[trackers]'; grpo only)",
    )
    add_dataclass_arguments(
        train.add_argument_group(
            "GRPO settings (GRPOConfig; defaults shown)",
            f"All apply to --algorithm grpo. --algorithm sft reads {_shared_flags(GRPOConfig, SFTConfig)} (its "
            "defaults: `--output-dir runs/sft --run-id sft --steps 20`) and the SFT settings below.",
        ),
        GRPOConfig,
    )
    add_dataclass_arguments(
        train.add_argument_group("SFT settings (SFTConfig; --algorithm sft only)"),
        SFTConfig,
        skip=_top_level(GRPOConfig),
    )
    train.set_defaults(func=_cmd_train)

    evaluate = commands.add_parser(
        "eval",
        help="run every task once, greedily, and print success and reward",
        description="Score an agent on a task set with a model directory, a training run or checkpoint "
        "(exported first), the tiny model, or an OpenAI-compatible server (--upstream).",
    )
    _add_run_arguments(evaluate, model_required=False)
    evaluate.add_argument(
        "--upstream",
        "--llm-endpoint",
        dest="upstream",
        help="an OpenAI-compatible base URL to evaluate instead of a local model (a capture proxy started here "
        "in front of it records the calls)",
    )
    evaluate.add_argument("--served-model", default="default", help="model name to ask --upstream for")
    evaluate.add_argument("--api-key", default=None, help="API key for --upstream")
    evaluate.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    evaluate.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    evaluate.add_argument("--json", action="store_true", help="also print the report as JSON")
    evaluate.add_argument(
        "--run-id",
        default=None,
        help="record the evaluation as this run in --store (metrics under eval:RUN_ID; the dashboard lists it "
        "beside training runs); default eval-<date>-<time>",
    )
    evaluate.set_defaults(func=_cmd_eval)


def _top_level(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _shared_flags(a: type, b: type) -> str:
    return ", ".join(
        f"--{name.replace('_', '-')}" + (".*" if name == "train" else "")
        for name in sorted(_top_level(a) & _top_level(b))
    )


def _refuse_foreign_flags(args: argparse.Namespace, used: type, other: type) -> None:
    """A flag of the other algorithm's settings is a mistake worth naming, not a silent no-op."""
    from agentgrad.config import ConfigError, config_fields

    own = _top_level(used)
    foreign = sorted(
        {
            s.path.partition(".")[0]
            for s in config_fields(other)
            if s.path.partition(".")[0] not in own and hasattr(args, s.path)
        }
    )
    if foreign:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in foreign)
        raise ConfigError(
            f"{flags}: not a setting of --algorithm {args.algorithm} ({used.__name__})", source="flags", key=foreign[0]
        )


def _add_run_arguments(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    parser.add_argument("agent", metavar="AGENT", help=AGENT_HELP)
    parser.add_argument(
        "--model",
        required=model_required,
        help=MODEL_HELP + ("" if model_required else " (or a training run or checkpoint directory)"),
    )
    parser.add_argument("--tasks", required=True, help="tasks: JSONL, JSON array, CSV or Parquet")
    parser.add_argument("--store", default=None, help="store URL (default: a SQLite file in the output directory)")
    parser.add_argument(
        "--runners",
        type=int,
        default=2,
        help="runner processes (0: started elsewhere with `agentgrad runner --store … --proxy …`)",
    )
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts in flight per runner")
    parser.add_argument("--llm-resource", default=None, metavar="NAME", help=LLM_RESOURCE_HELP)
    parser.add_argument(
        "--device",
        default=None,
        help="where the engine runs (default cpu) and, for train, the trainer unless train.device names another: "
        "cpu, cuda, cuda:N or auto (train's default: the engine on the CPU, the trainer on a GPU if there is one)",
    )
    add_engine_dtype_argument(parser)
    add_prefix_cache_arguments(parser, "the local engine: ")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the engine and the trainer (1 is fastest on a small shared CPU)",
    )


@dataclass
class _Run:
    """What a training run starts from, every input already checked."""

    config: Any  # GRPOConfig, or SFTConfig for --algorithm sft
    agent: Any
    tasks: list[Any]
    val_tasks: list[Any]
    test_tasks: list[Any]
    model_dir: Path
    out: Path
    store_url: str


def _load_agent(args: argparse.Namespace) -> Any:
    """The agent ``args.agent`` names; fills in what ``train`` and ``eval`` read after it: the
    device (``cpu`` unless given) and the agent's LLM resource name. With ``--runners 0`` an agent
    that cannot be imported here is left to the runners started elsewhere (its framework may be
    installed only where they run), with a note saying what that costs."""
    from agentgrad.agents import ServedElsewhere
    from agentgrad.errors import AgentImportError

    args.device = args.device or "cpu"
    try:
        agent = load_cli_agent(args.agent)
    except AgentImportError as exc:
        if args.runners != 0:
            raise
        agent = ServedElsewhere(args.agent)
        print(
            f"note: {exc}. With --runners 0 the runners started elsewhere import it; its "
            "trained_agents and llm_resource are not read here (give --agent-match, --llm-resource).",
            file=sys.stderr,
        )
    args.llm_resource = llm_resource_name(args.llm_resource, agent)
    return agent


def _prepare(args: argparse.Namespace) -> _Run:
    """Read and check everything a run needs (settings, agent, task files, model) before anything
    starts, then create the output directory with the resolved ``config.yaml`` in it."""
    import torch

    from agentgrad.algorithms.grpo import GRPOConfig
    from agentgrad.algorithms.sft import SFTConfig
    from agentgrad.config import dump, resolve
    from agentgrad.errors import InvalidInputError
    from agentgrad.tasks import read_tasks
    from agentgrad.training.policy import check_model

    used: type[GRPOConfig | SFTConfig]
    other: type[GRPOConfig | SFTConfig]
    used, other = (SFTConfig, GRPOConfig) if args.algorithm == "sft" else (GRPOConfig, SFTConfig)
    _refuse_foreign_flags(args, used, other)
    config: GRPOConfig | SFTConfig = resolve(used, args.config, args)
    if args.device is not None and config.train.device == "auto":
        # `--device cpu` on a GPU machine keeps the trainer on the CPU too (train.device set to another wins)
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, device=args.device))
    agent = _load_agent(args)
    trained = getattr(agent, "trained_agents", None)  # an agentlightning LitAgent's own agent_match
    if config.agent_match is None and trained:
        config = dataclasses.replace(config, agent_match=trained)
    tasks = read_tasks(args.tasks)
    val_tasks = read_tasks(args.val) if args.val else []
    test_tasks = read_tasks(args.test) if args.test else []
    # --test scores exported model directories, --lora-hot-swap loads adapters, the engine flags set up the
    # engine: each needs the engine this command starts.
    local_flags = (("--test", test_tasks), ("--lora-hot-swap", args.lora_hot_swap))
    local_only = [flag for flag, given in local_flags if given] + engine_flags_given(args)
    if local_only and (args.upstream or args.backend != "local"):
        raise InvalidInputError(
            f"{' and '.join(local_only)} need{'s' if len(local_only) == 1 else ''} the local engine this command "
            "starts: not --upstream or --backend "
            "tinker (score such a run afterwards with `agentgrad eval AGENT --upstream URL --tasks FILE`)"
        )
    model_dir = resolve_model(args.model)
    check_model(model_dir)  # a missing tokenizer or chat template is named now, not mid-run
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    dump(config, out / "config.yaml")
    torch.set_num_threads(args.threads)
    return _Run(
        config,
        agent,
        tasks,
        val_tasks,
        test_tasks,
        model_dir,
        out,
        args.store or f"sqlite://{(out / 'store.sqlite').resolve()}",
    )


def _test_score(args: argparse.Namespace, run: _Run, store: Any, model: Path, label: str, console: Any) -> float:
    """Greedy score of the model directory ``model`` on the run's test tasks (a fresh engine on
    it, recorded in the run's store as the evaluation ``<run_id>-test-<label>``)."""
    report = run_on_local_model(
        str(model),
        run.agent,
        run.test_tasks,
        store,
        llm_resource=args.llm_resource,
        sampling={"temperature": 0.0},
        engine=engine_keywords(args),
        runners=args.runners,
        concurrency=args.concurrency,
        run_id=f"{run.config.run_id}-test-{label}",
        mode="test",
        quiet=True,
    )
    console.print(f"  [cyan]test (greedy, {len(run.test_tasks)} tasks), {label} model: {report.score:.3f}[/]")
    return report.score


def _test_after(
    args: argparse.Namespace, run: _Run, store: Any, start: float | None, final: Path, best: Path | None, console: Any
) -> dict[str, float] | None:
    """The test scores of the start, final and best models (None without --test)."""
    if start is None:
        return None
    scores = {"start": start, "final": _test_score(args, run, store, final, "final", console)}
    if best is not None:
        scores["best"] = _test_score(args, run, store, best, "best", console)
    return scores


def _print_validation(
    validation: Sequence[tuple[int, float]], tasks: int, best: float | None, when: str, console: Any
) -> None:
    """The run's greedy validation, first score → last, and its ``best`` score (reached ``when``)."""
    if validation:
        first, last = validation[0][1], validation[-1][1]
        console.print(f"greedy validation on {tasks} tasks: [bold]{first:.3f} → {last:.3f}[/] (best {best:.3f} {when})")


def _print_test(scores: dict[str, float] | None, tasks: int, console: Any) -> None:
    if scores:
        best = f" (best model {scores['best']:.3f})" if "best" in scores else ""
        console.print(
            f"greedy test on {tasks} held-out tasks: [bold]{scores['start']:.3f} → {scores['final']:.3f}[/]{best}"
        )


def _cmd_train(args: argparse.Namespace) -> int:
    from agentgrad.errors import AgentGradError

    if args.algorithm == "apo":
        raise AgentGradError(
            "`agentgrad train --algorithm apo` is not wired: APO optimizes a prompt template, not the model, and "
            "needs critic and editor LLM endpoints and a seed prompt. Use `agentgrad apo AGENT --tasks FILE "
            "--prompt TEMPLATE --critic-base-url URL --critic-model NAME` (see `agentgrad apo --help`)."
        )
    if args.algorithm == "evaluate":
        return _cmd_eval(
            argparse.Namespace(**{**vars(args), "upstream": None, "temperature": 0.0, "timeout": None, "json": False})
        )
    if args.algorithm == "sft":
        return _train_sft(args)
    from agentgrad.algorithms.base import run_console
    from agentgrad.algorithms.curve import plot_rewards
    from agentgrad.algorithms.grpo import GRPO
    from agentgrad.algorithms.trackers import make_trackers
    from agentgrad.store import open_store
    from agentgrad.trainer import Trainer

    console = run_console()
    run = _prepare(args)
    config, agent, tasks, val_tasks = run.config, run.agent, run.tasks, run.val_tasks
    model_dir, out = run.model_dir, run.out
    trackers = make_trackers(args.tracker or [], out, config.run_id)
    store = open_store(run.store_url)
    console.print(
        f"training [bold]{args.agent}[/] on {model_dir} · {len(tasks)} train / {len(val_tasks)} val / "
        f"{len(run.test_tasks)} test tasks · output {out}",
        soft_wrap=True,  # a path cut across lines cannot be copied
    )
    hint = _bf16_hint(args, config.train, model_dir)
    if hint:
        console.print(hint, style="dim", soft_wrap=True)
    try:
        start = _test_score(args, run, store, model_dir, "start", console) if run.test_tasks else None
        if args.upstream and args.backend == "local":  # the engine runs elsewhere: new weights go to it over HTTP
            from agentgrad.training.publish import ModelServerPublisher

            grpo = GRPO(
                model_dir, config, trackers=trackers, publisher=ModelServerPublisher(args.upstream, out / "published")
            )
            result = _fit_on_upstream(args, grpo, agent, tasks, val_tasks, store, console)
        else:
            with _policy(args, model_dir).serving(store) as policy:
                trainer = Trainer(
                    store,
                    algorithm=GRPO(model_dir, config, trackers=trackers),
                    policy=policy,
                    n_runners=args.runners,
                    concurrency=args.concurrency,
                    llm_resource=args.llm_resource,
                    console=console,
                )
                result = trainer.fit(agent, tasks, val_tasks)
        best = out / "best" if result.best_step is not None else None
        test = _test_after(args, run, store, start, out / "model", best, console) if result.steps else None
    except RuntimeError as exc:  # GRPO's "nothing could be trained" (every batch empty) and its kin
        console.print(f"[red]error:[/] {exc}")
        return 1
    finally:
        store.close()
    curve = plot_rewards(
        result.history, result.validation, out / "reward_curve.png", title=f"agentgrad train: {args.agent}"
    )
    summary = {
        "steps": result.steps,
        "validation": result.validation,
        "best_step": result.best_step,
        "best_score": result.best_score,
        "model": str(out / "model"),
        "best_model": str(best) if best is not None else None,
        "test": test,
        "reward_curve": str(curve),
        "config": str(out / "config.yaml"),
        "store": run.store_url,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.rule("[bold]agentgrad train")
    _print_validation(result.validation, len(val_tasks), result.best_score, f"at step {result.best_step}", console)
    _print_test(test, len(run.test_tasks), console)
    console.print(f"{result.steps} GRPO steps · final model {out / 'model'} · best model {summary['best_model']}")
    console.print(f"serve it:     agentgrad serve-model {out / 'model'}", soft_wrap=True)
    console.print(f"dashboard:    agentgrad dashboard --store {summary['store']}", soft_wrap=True)
    if result.steps == 0:
        console.print("[red]error:[/] no step trained (see the messages above)")
        return 1
    return 0


def _bf16_hint(args: argparse.Namespace, train: Any, model_dir: Path) -> str | None:
    """A line naming the bf16 switches when they would speed this run up and none is set: a local
    engine and trainer on a CPU with native bf16 instructions, a model of some size."""
    from agentgrad.training.policy import native_cpu_bf16, trainer_device_and_dtype, weight_files

    if args.backend != "local" or args.upstream or args.engine_dtype or train.autocast is not None:
        return None
    if sum(f.stat().st_size for f in weight_files(model_dir)) < _BF16_HINT_BYTES or not native_cpu_bf16():
        return None
    if args.device != "cpu" or trainer_device_and_dtype(train)[0].type != "cpu":
        return None
    return (
        "hint: this CPU multiplies bf16 natively: --engine-dtype bfloat16 --train.autocast bfloat16 trained "
        'SmolLM2-135M as far in 60–90 % of the time on two CPUs (docs/training.md, "Mixed precision")'
    )


def _policy(args: argparse.Namespace, model_dir: Path) -> Any:
    """The policy to serve and train: local (an engine in this process) or on a Tinker server."""
    from agentgrad.errors import InvalidInputError
    from agentgrad.training.local import LocalPolicy

    if args.backend == "local":
        if args.tinker_url or args.tinker_base_model:
            raise InvalidInputError("--tinker-url and --tinker-base-model need --backend tinker")
        return LocalPolicy(
            model_dir,
            **engine_keywords(args),
            proxy_host=args.proxy_host,
            proxy_port=args.proxy_port,
            lora_hot_swap=args.lora_hot_swap,
        )
    if args.upstream:
        raise InvalidInputError("--backend tinker samples from the Tinker server: it takes no --upstream")
    if not args.tinker_url:
        raise InvalidInputError("--backend tinker needs --tinker-url (the Tinker server's root URL)")
    from agentgrad.training.tinker import TinkerPolicy, TinkerSettings

    return TinkerPolicy(
        model_dir,
        TinkerSettings(args.tinker_url, base_model=args.tinker_base_model, reduction=args.tinker_reduction),
        proxy_host=args.proxy_host,
        proxy_port=args.proxy_port,
    )


def _fit_on_upstream(
    args: argparse.Namespace, grpo: Any, agent: Any, tasks: list[Any], val_tasks: list[Any], store: Any, console: Any
) -> Any:
    """GRPO against an AgentGrad model server started elsewhere (``agentgrad serve-model`` of the
    same model): a capture proxy here in front of it; the trainer here, publishing to it."""
    from agentgrad.errors import InvalidInputError
    from agentgrad.http.guard import MODEL_TOKEN_ENV, env_token
    from agentgrad.http.transport import request_json
    from agentgrad.proxy import LLMProxy
    from agentgrad.trainer import Trainer
    from agentgrad.types import LLM

    v1 = args.upstream.rstrip("/").removesuffix("/v1") + "/v1"
    try:
        token = env_token(MODEL_TOKEN_ENV)  # a model server started with --token
        served = request_json(
            "GET", f"{v1}/models", headers={"Authorization": f"Bearer {token}"} if token else None, timeout=10
        ).json()["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise InvalidInputError(
            f"--upstream {args.upstream}: no OpenAI-compatible model server answers there ({type(exc).__name__}: {exc})"
        ) from None
    with LLMProxy(store, v1) as proxy:
        trainer = Trainer(
            store,
            algorithm=grpo,
            proxy=proxy,
            n_runners=args.runners,
            concurrency=args.concurrency,
            llm_resource=args.llm_resource,
            console=console,
        )
        return trainer.fit(agent, tasks, val_tasks, resources={args.llm_resource: LLM(endpoint=v1, model=served)})


def _train_sft(args: argparse.Namespace) -> int:
    """``--algorithm sft``: rejection-sampling SFT with the same embedded policy and runners as GRPO."""
    from agentgrad.algorithms.base import run_console
    from agentgrad.algorithms.sft import SFT
    from agentgrad.store import open_store
    from agentgrad.trainer import Trainer

    console = run_console()
    run = _prepare(args)
    config, agent, tasks, val_tasks = run.config, run.agent, run.tasks, run.val_tasks
    model_dir, out, store_url = run.model_dir, run.out, run.store_url
    store = open_store(store_url)
    console.print(
        f"SFT of [bold]{args.agent}[/] on {model_dir} · {len(tasks)} tasks × {config.samples_per_task} "
        f"samples · {len(val_tasks)} val / {len(run.test_tasks)} test tasks · output {out}",
        soft_wrap=True,
    )
    try:
        start = _test_score(args, run, store, model_dir, "start", console) if run.test_tasks else None
        with _policy(args, model_dir).serving(store) as policy:
            trainer = Trainer(
                store,
                algorithm=SFT.from_config(model_dir, config),
                policy=policy,
                n_runners=args.runners,
                concurrency=args.concurrency,
                llm_resource=args.llm_resource,
                console=console,
            )
            result = trainer.fit(agent, tasks, val_tasks)
        best_dir = out / "best" if result.best_iteration is not None else None
        test = _test_after(args, run, store, start, Path(result.model), best_dir, console)
    except RuntimeError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 1
    finally:
        store.close()
    best = str(best_dir) if best_dir is not None else None
    summary = {
        "algorithm": "sft",
        "iterations": len(result.versions),
        "samples": result.samples,
        "steps": len(result.history),
        "versions": result.versions,
        "funnels": [funnel.describe() for funnel in result.funnels],
        "validation": result.validation,
        "best_iteration": result.best_iteration,
        "best_score": result.best_score,
        "model": str(result.model),
        "best_model": best,
        "test": test,
        "config": str(out / "config.yaml"),
        "store": store_url,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.rule("[bold]agentgrad train --algorithm sft")
    when = f"after iteration {result.best_iteration}"
    _print_validation(result.validation, len(val_tasks), result.best_score, when, console)
    _print_test(test, len(run.test_tasks), console)
    console.print(
        f"{len(result.history)} SFT steps on {sum(result.samples)} sequence(s) · final model "
        f"{result.model} · best model {best}"
    )
    console.print(f"serve it:     agentgrad serve-model {result.model}", soft_wrap=True)
    console.print(f"dashboard:    agentgrad dashboard --store {store_url}", soft_wrap=True)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from agentgrad.store import open_store
    from agentgrad.tasks import read_tasks
    from agentgrad.trainer import Trainer
    from agentgrad.types import LLM

    if (args.model is None) == (args.upstream is None):
        raise SystemExit(
            "eval needs exactly one of --model (a local model, run or checkpoint) and --upstream URL "
            "(with --served-model NAME)"
        )
    agent = _load_agent(args)
    tasks = read_tasks(args.tasks)
    run_id = getattr(args, "run_id", None) or time.strftime("eval-%Y%m%d-%H%M%S")
    with tempfile.TemporaryDirectory(prefix="agentgrad-eval-") as work:
        store = open_store(args.store or f"sqlite://{Path(work) / 'store.sqlite'}")
        try:
            if args.upstream:
                llm = LLM(
                    endpoint=args.upstream,
                    model=args.served_model,
                    api_key=args.api_key,
                    sampling={"temperature": args.temperature},
                )
                report = Trainer(store, n_runners=args.runners, concurrency=args.concurrency).dev(
                    agent, tasks, {args.llm_resource: llm}, timeout=args.timeout, run_id=run_id
                )
            else:
                report = run_on_local_model(
                    args.model,
                    agent,
                    tasks,
                    store,
                    llm_resource=args.llm_resource,
                    sampling={"temperature": args.temperature},
                    engine=engine_keywords(args),
                    runners=args.runners,
                    concurrency=args.concurrency,
                    timeout=args.timeout,
                    run_id=run_id,
                )
        finally:
            store.close()
    if args.json:
        print(json.dumps(report.as_dict()))
    return 0 if report.succeeded else 1
