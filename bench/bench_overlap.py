"""Synchronous against overlapped GRPO on the demo task: time to 0.90 held-out greedy success (issue 20).

Prints JSON. Each round runs ``agentgrad demo`` (the calculator agent on the shipped tiny model,
2 runner processes, the same settings) twice, once per mode, in alternating order (the machine
is noisy): ``sync`` samples, then trains; ``overlap`` (``GRPOConfig.overlap``, ``max_staleness``
1, ``train.tis_cap`` 2) samples the next batch while the trainer updates.

Success against wall-clock time is measured two ways:

- **published** (the default measure): every weight version the trainer publishes is recorded
  with the time the engine got it (a bench-only wrapper of ``LocalEnginePublisher.publish``), and
  after the run each is scored greedily on 128 held-out *test* problems, off the clock. The curve
  is then the success of the policy the runners were sampling from at each moment, and the run
  pays for no measurement. ``time_to_target_s`` is when the first version at or above
  ``--target`` was published.
- **validated**: the run's own greedy validation (``--val-every`` steps; 0: only at step 0 and at
  the end). It costs both modes the same and, every step, hides most of what overlap saves; in
  overlap mode a validation also queues behind the next batch, so it lags the weights it scores.

Times count from the end of the step-0 validation (training starts there). Per run: both curves
and times to target, the final and best success, median step seconds, training rollouts per
second of steps, and the trainer's and runners' idle fractions (time-weighted over the steps). The
summary gives medians and ranges per mode. ``--plot PNG`` draws published success against
wall-clock time for every run.

    python bench/bench_overlap.py --rounds 3 --steps 12 --plot docs/img/overlap.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(REPO / "src"))

MODES = {"sync": {}, "overlap": {"overlap": True}}


@contextlib.contextmanager
def recording_published() -> Iterator[list[tuple[float, dict[str, Any]]]]:
    """Record (wall-clock time, weights) of every version the local engine is given, while inside."""
    from agentgrad.training import publish as module

    published: list[tuple[float, dict[str, Any]]] = []
    original = module.LocalEnginePublisher.publish

    def publish(publisher: Any, trainer: Any) -> Any:
        result = original(publisher, trainer)
        # the weights as the engine names them (LoRA merged in), already a copy
        published.append((time.time(), module.local_trainer(trainer).engine_state_dict()))
        return result

    module.LocalEnginePublisher.publish = publish  # type: ignore[method-assign]
    try:
        yield published
    finally:
        module.LocalEnginePublisher.publish = original  # type: ignore[method-assign]


def score_published(published: list[tuple[float, dict[str, Any]]], origin: float) -> list[tuple[float, float]]:
    """Greedy success of the start model (at time 0) and of each published version (at the time
    it was published, seconds after ``origin``) on 128 held-out test problems."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgrad.demo.calc import generate_problems
    from agentgrad.demo.tiny import ensure_tiny_model, evaluate_greedy

    model_dir = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = generate_problems(128, 0, "test")
    curve = [(0.0, evaluate_greedy(model, tokenizer, problems)["success"])]
    for when, state in published:
        model.load_state_dict(state)
        curve.append((round(when - origin, 2), evaluate_greedy(model, tokenizer, problems)["success"]))
    return curve


def run_once(mode: str, steps: int, target: float, val_every: int, output_dir: Path) -> dict[str, Any]:
    from agentgrad.demo.run import run_demo

    started = time.monotonic()
    # the demo's progress goes to stderr (stdout is the JSON)
    with contextlib.redirect_stdout(sys.stderr), recording_published() as published:
        summary = run_demo(
            steps=steps, minutes=30, output_dir=output_dir, settings={"val_every": val_every, **MODES[mode]}
        )
    wall = time.monotonic() - started
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in records if "val/reward_mean" in r]
    origin = validated[0]["time"]  # the end of the step-0 validation: training starts here
    validated_curve = [(round(r["time"] - origin, 2), r["val/reward_mean"]) for r in validated]
    curve = score_published(published, origin)
    reached = next((t for t, success in curve if success >= target), None)
    steps_done = [r for r in records if "step_seconds" in r]
    total = sum(r["step_seconds"] for r in steps_done)

    def weighted(key: str) -> float:
        return round(sum(r[key] * r["step_seconds"] for r in steps_done) / total, 3)

    return {
        "mode": mode,
        "time_to_target_s": reached,
        "validated_time_to_target_s": next((t for t, success in validated_curve if success >= target), None),
        "curve": curve,
        "validated_curve": validated_curve,
        "final": curve[-1][1],
        "best": max(success for _, success in curve),
        "median_step_s": round(statistics.median(r["step_seconds"] for r in steps_done), 2),
        "rollouts_per_s": round(sum(r["rollouts"] for r in steps_done) / total, 1),  # training rollouts only
        "trainer_idle_fraction": weighted("trainer_idle_fraction"),
        "runner_idle_fraction": weighted("runner_idle_fraction"),
        "training_wall_s": round(validated_curve[-1][0], 1),
        "run_wall_s": round(wall, 1),
        "steps": summary["steps"],
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        entry: dict[str, Any] = {"runs": len(mine)}
        for key in (
            "time_to_target_s",
            "validated_time_to_target_s",
            "median_step_s",
            "rollouts_per_s",
            "trainer_idle_fraction",
            "runner_idle_fraction",
            "final",
            "best",
        ):
            values = [r[key] for r in mine if r[key] is not None]
            entry[key] = (
                {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None
            )
        entry["reached_target"] = sum(r["time_to_target_s"] is not None for r in mine)
        out[mode] = entry
    return out


def plot(runs: list[dict[str, Any]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = {"sync": "tab:blue", "overlap": "tab:orange"}
    for mode in MODES:
        for i, run in enumerate(r for r in runs if r["mode"] == mode):
            times, success = zip(*run["curve"], strict=True)
            ax.plot(times, success, marker=".", color=colors[mode], alpha=0.8, label=mode if i == 0 else None)
    ax.axhline(target, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds of training (when each version was published)")
    ax.set_ylabel("greedy success of the published policy, 128 test problems")
    ax.set_title("GRPO on the demo task: synchronous vs overlapped")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs per mode (alternating order)")
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per run")
    parser.add_argument("--target", type=float, default=0.90, help="held-out greedy success to reach")
    parser.add_argument(
        "--val-every",
        type=int,
        default=0,
        help="the run's own validation every this many steps (0: only at step 0 and at the end; "
        "the published policies are scored after the run either way)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="write success vs wall-clock time to this PNG")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-overlap-") as tmp:
        for round_ in range(args.rounds):
            order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
            for mode in order:
                result = run_once(mode, args.steps, args.target, args.val_every, Path(tmp) / f"{mode}-{round_}")
                result["round"] = round_
                runs.append(result)
                print(json.dumps({k: v for k, v in result.items() if "curve" not in k}), file=sys.stderr, flush=True)
    if args.plot:
        plot(runs, args.target, args.plot)
    report = {
        "task": "agentgrad demo (calculator agent, shipped tiny model, 2 runner processes)",
        "target": args.target,
        "val_every": args.val_every,
        "cpu_count": os.cpu_count(),
        "summary": summarize(runs),
        "runs": runs,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
