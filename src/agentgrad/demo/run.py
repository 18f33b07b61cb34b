"""The demo run: watch an unmodified OpenAI-client agent get better, on a laptop CPU.

Everything runs embedded: a SQLite store file in the output directory, the local inference
engine and its OpenAI-compatible server, the capture proxy, runner processes executing the
calculator agent (``agentgrad.demo.agent``) and GRPO training the tiny calculator model (built on
first use). It prints greedy success on held-out problems before and after, shows progress live, writes a reward curve
(``reward_curve.png``) and leaves ``store.sqlite`` for ``agentgrad dashboard``.

It is a thin caller of the public API — a :class:`~agentgrad.training.local.LocalPolicy` serving
the model, a :class:`~agentgrad.trainer.Trainer` running :class:`~agentgrad.algorithms.grpo.GRPO`
— so it doubles as the example of training your own agent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgrad.store.protocol import Store
    from agentgrad.types import Rollout

#: Settings measured on 2 CPU cores (see examples/calc/README.md). The learning rate is 2e-4 (the
#: tiny model's ``default_lr``), not the 5e-4 it was: at 5e-4 the first five steps teach the words
#: questions to call the tool but also teach "Calculate a + b" → ``a * b``, a mistake entropy
#: collapse then makes permanent (docs/training.md, "Stability"); the other stability settings
#: measured no better and stay off.
DEMO_SETTINGS: dict[str, Any] = {
    "batch_size": 16,
    "group_size": 8,
    "lr": 2e-4,
    "temperature": 1.0,
    "mini_batches": 1,
    "epochs": 1,
    "val_size": 128,
    "val_every": 5,
    "kl_coef": 0.0,
    "lr_decay": "none",
    "lr_final": 0.0,
    "agreeing_groups": "drop",
    "seed": 0,
    # Overlap: sample the next batch while training on this one (one version stale, TIS-corrected).
    "overlap": False,
    "tis_cap": 2.0,
}


def validation_by_kind(store: Store, steps: list[int]) -> dict[int, dict[str, float]]:
    """Greedy held-out success at each validation, per question kind (``words``: "37 times 12",
    ``symbols``: "37 * 12"), read back from the store's validation rollouts: the warm-up left the
    two kinds far apart, and a run that regresses usually regresses on one of them."""
    from agentgrad.demo.calc import in_words
    from agentgrad.store.protocol import RolloutFilter

    runs: dict[str, list[Rollout]] = {}  # one validation per resources id, in the order they ran
    for rollout in store.query_rollouts(RolloutFilter(mode="val")):
        runs.setdefault(rollout.resources_id or "", []).append(rollout)
    out: dict[int, dict[str, float]] = {}
    for step, rollouts in zip(steps, runs.values(), strict=False):
        kinds: dict[str, list[float]] = {"words": [], "symbols": []}
        for r in rollouts:
            kinds["words" if in_words(r.input["question"]) else "symbols"].append(float((r.reward or 0.0) > 0))
        out[step] = {kind: round(sum(v) / len(v), 3) for kind, v in kinds.items() if v}
    return out


def run_demo(
    *,
    steps: int = 30,
    minutes: float = 8.0,
    output_dir: str | Path = "runs/demo",
    n_runners: int = 2,
    store_url: str | None = None,
    concurrency: int = 24,
    settings: dict[str, Any] | None = None,
    model_dir: str | Path | None = None,
    resume: bool = False,
    threads: int = 1,
) -> dict[str, Any]:
    """Run the whole demo; returns a summary (also written to ``summary.json``)."""
    import torch

    from agentgrad.algorithms.base import run_console
    from agentgrad.algorithms.curve import plot_rewards
    from agentgrad.algorithms.grpo import GRPO, GRPOConfig
    from agentgrad.demo.agent import calc_agent
    from agentgrad.demo.calc import generate_problems
    from agentgrad.demo.tiny import ensure_tiny_model
    from agentgrad.store import open_store
    from agentgrad.trainer import Trainer
    from agentgrad.training import TrainConfig
    from agentgrad.training.local import LocalPolicy

    # One intra-op thread: on a small shared CPU, torch's spinning thread pool loses several-fold
    # to oversubscription, and the engine and trainer take turns anyway (measured: 4× faster).
    torch.set_num_threads(threads)
    console = run_console()
    opts = {**DEMO_SETTINGS, **(settings or {})}
    out = Path(output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        for stale in ("metrics.jsonl", "store.sqlite", "store.sqlite-wal", "store.sqlite-shm"):
            (out / stale).unlink(missing_ok=True)
    if model_dir is None:
        with console.status("building the tiny model (first run only, ≈ 5–11 min)…"):
            model_dir = ensure_tiny_model()
    store = open_store(store_url or f"sqlite://{out / 'store.sqlite'}")
    try:
        grpo = GRPO(
            model_dir,
            GRPOConfig(
                steps=steps,
                max_seconds=minutes * 60,
                batch_size=opts["batch_size"],
                group_size=opts["group_size"],
                mini_batches=opts["mini_batches"],
                epochs=opts["epochs"],
                sampling={"temperature": opts["temperature"]},
                train=TrainConfig(
                    lr=opts["lr"],
                    betas=(0.9, 0.99),
                    grad_clip=1.0,
                    kl_coef=opts["kl_coef"],
                    lr_decay=opts["lr_decay"],
                    lr_final=opts["lr_final"],
                    seed=opts["seed"],
                    tis_cap=opts["tis_cap"] if opts["overlap"] else None,
                ),
                overlap=opts["overlap"],
                max_staleness=1 if opts["overlap"] else 0,
                val_every=opts["val_every"],
                output_dir=out,
                run_id="demo",
                checkpoint_every=10,
                resume=resume,
                agreeing_groups=opts["agreeing_groups"],
                seed=opts["seed"],
                rollout_timeout_seconds=120,
                max_attempts=1,
            ),
        )
        with LocalPolicy(model_dir, served_model_name="tiny-calc").serving(store) as policy:
            console.print(
                f"store [bold]{out / 'store.sqlite'}[/] · model server {policy.upstream_url} · "
                f"proxy {policy.proxy_url}/v1"
            )
            started = time.monotonic()
            trainer = Trainer(
                store, algorithm=grpo, policy=policy, n_runners=n_runners, concurrency=concurrency, console=console
            )
            result = trainer.fit(
                calc_agent, generate_problems(4000, 0, "train"), generate_problems(opts["val_size"], 0, "val")
            )
            wall = time.monotonic() - started
        by_kind = validation_by_kind(store, [step for step, _ in result.validation])
    finally:
        store.close()
    before = result.validation[0][1] if result.validation and result.validation[0][0] == 0 else None
    after = result.validation[-1][1] if result.validation else None
    plot = plot_rewards(
        result.history,
        result.validation,
        out / "reward_curve.png",
        title="agentgrad demo: calculator agent, tiny model",
    )
    summary = {
        "steps": result.steps,
        "wall_seconds": round(wall, 1),
        "greedy_success_before": before,
        "greedy_success_after": after,
        "validation": result.validation,
        "validation_by_kind": by_kind,
        "best_step": result.best_step,
        "best_score": result.best_score,
        "settings": opts,
        "reward_curve": str(plot),
        "store": str(out / "store.sqlite"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.rule("[bold]agentgrad demo")
    console.print(
        f"greedy success on {opts['val_size']} held-out problems: "
        f"[bold]{_fmt(before)} → {_fmt(after)}[/] after {result.steps} GRPO steps in {wall / 60:.1f} min"
    )
    console.print(f"reward curve: {plot}")
    console.print(f"dashboard:    agentgrad dashboard --store sqlite://{out / 'store.sqlite'}", soft_wrap=True)
    return summary


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"
