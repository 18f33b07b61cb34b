"""Each advantage estimator (and DPO from groups) on the demo task: held-out greedy success per step.

Prints JSON. Every run is ``agentgrad train`` of the demo's calculator agent on the shipped tiny
model with the demo's settings (16 tasks × groups of 8 per step, lr 2e-4, full fine-tuning,
temperature 1, one on-policy update per step), changing only ``estimator`` (and ``seed``, the
order of the training tasks). Greedy validation on the demo's 128 held-out problems every
``--val-every`` steps gives the curve; ``--test`` scores 128 other held-out problems on the start
model and on the exported final and best models. Runs go one after another, estimators
alternating within each seed.

Per run: the validation curve as (step, success), its final and best, the test scores, the share
of groups that agreed (no signal) over the last five steps, and the wall time. ``--plot PNG``
draws every run's curve.

    python bench/bench_estimators.py --steps 15 --seeds 0 1 --plot docs/img/algorithms-demo.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ESTIMATORS = ("grpo", "rloo", "reinforce++", "dr_grpo", "dpo")
CONFIG = """\
batch_size: 16
group_size: 8
mini_batches: 1
epochs: 1
sampling: {{temperature: 1.0}}
train: {{lr: 0.0002, betas: [0.9, 0.99], grad_clip: 1.0}}
steps: {steps}
val_every: {val_every}
checkpoint_every: 10
rollout_timeout_seconds: 120
max_attempts: 1
"""


def write_tasks(directory: Path) -> None:
    from agentgrad.demo.calc import generate_problems

    for name, n in (("train", 4000), ("val", 128), ("test", 128)):
        with open(directory / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(p) + "\n" for p in generate_problems(n, 0, name))


def run_once(estimator: str, seed: int, work: Path) -> dict[str, Any]:
    out = work / f"{estimator}-{seed}"
    command = [
        str(Path(sys.executable).with_name("agentgrad")),
        *("train", "agentgrad.demo.agent:calc_agent", "--model", "tiny"),
        *("--tasks", str(work / "train.jsonl"), "--val", str(work / "val.jsonl")),
        *("--test", str(work / "test.jsonl"), "--config", str(work / "run.yaml")),
        *("--estimator", estimator, "--seed", str(seed), "--concurrency", "24"),
        *("--output-dir", str(out), "--run-id", f"{estimator}-{seed}"),
    ]
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=sys.stderr, cwd=work)
    wall = time.monotonic() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["val/reward_mean"]) for r in records if "val/reward_mean" in r]
    last = [r for r in records if r.get("grpo/groups")][-5:]
    test = json.loads((out / "summary.json").read_text()).get("test", {})
    return {
        "estimator": estimator,
        "seed": seed,
        "curve": curve,
        "final": curve[-1][1],
        "best": max(success for _, success in curve),
        "test": test,
        "groups_agreeing_last_5": round(
            sum(r["grpo/zero_variance_groups"] for r in last) / sum(r["grpo/groups"] for r in last), 2
        )
        if last
        else None,
        "wall_s": round(wall, 1),
    }


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = dict(zip(ESTIMATORS, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"), strict=True))
    for run in runs:
        steps, success = zip(*run["curve"], strict=True)
        style = "-" if run["seed"] == runs[0]["seed"] else "--"
        label = f"{run['estimator']}, seed {run['seed']}"
        ax.plot(steps, success, style, marker=".", color=colors[run["estimator"]], alpha=0.85, label=label)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("greedy success, 128 held-out problems")
    ax.set_title("Estimators on the demo task (tiny model)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=ESTIMATORS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--plot", type=Path, default=None, help="write every run's curve to this PNG")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-estimators-") as tmp:
        work = Path(tmp)
        write_tasks(work)
        (work / "run.yaml").write_text(CONFIG.format(steps=args.steps, val_every=args.val_every))
        for seed in args.seeds:
            for estimator in args.estimators:
                result = run_once(estimator, seed, work)
                runs.append(result)
                print(json.dumps(result), file=sys.stderr, flush=True)
    if args.plot:
        plot(runs, args.plot)
    report = {
        "task": "the demo's calculator agent, shipped tiny model, agentgrad train with the demo's settings",
        "steps": args.steps,
        "cpu_count": os.cpu_count(),
        "runs": runs,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
