"""GRPO step time by phase: training through the Tinker API (a SkyRL server) vs the local backend.

The same GRPO run of the calculator agent (the tiny model's Qwen3 twin, 4 tasks × 4 rollouts,
LoRA r=8, one update per step) on both backends, ``--runs`` times each, alternating (tinker,
local, tinker, …) so a change in the machine's load falls on both. Each Tinker run gets a fresh
SkyRL Tinker server (JAX backend, CPU) on 127.0.0.1. Per phase — rollouts, the update, publishing
the new weights to the sampler, the whole step — the first trained step is ``cold`` (on the JAX
server it compiles) and the median of the later ones ``warm``; the JSON has each run's numbers
and their medians, and ``server_start_seconds`` (the server's launch until it answers).

Needs what ``make test-scale`` installs (``scripts/setup_scale_env.sh``; without it the bench
prints why it skipped); the run itself is ``tests/scale/scale_run.py``'s, the one the scale test
makes.

Usage: ``python bench/bench_tinker.py [--runs 3] [--steps 4] [--markdown] [--keep DIR]`` (JSON on
stdout; ``--markdown`` adds the table of docs/scale-out.md on stderr; ``--keep`` keeps each run's
server log and metrics).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "scale"))

from scale_run import (  # noqa: E402  (tests/scale is on sys.path)
    DESCRIPTION,
    PHASES,
    SERVER_PROJECT,
    grpo_run,
    phases,
    qwen3_twin,
    skyrl_server,
    trained_steps,
)


def one_run(backend: str, model: Path, work: Path, steps: int) -> dict[str, Any]:
    from agentgrad.training.local import LocalPolicy
    from agentgrad.training.tinker import TinkerPolicy, TinkerSettings

    out = work / "run"
    if backend == "local":
        _, _, seconds = grpo_run(LocalPolicy(model), model, out, steps=steps)
        return {**phases(trained_steps(out)), "run_seconds": seconds}
    launched = time.monotonic()
    with skyrl_server(model, work / "server") as url:
        up = time.monotonic() - launched
        _, _, seconds = grpo_run(TinkerPolicy(model, TinkerSettings(url)), model, out, steps=steps)
    return {**phases(trained_steps(out)), "run_seconds": seconds, "server_start_seconds": up}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase, the median over runs of each run's cold and warm seconds."""
    out: dict[str, Any] = {}
    for kind in ("cold", "warm"):
        rows = [r[kind] for r in runs if r[kind] is not None]
        out[kind] = {p: round(statistics.median(r[p] for r in rows), 3) for p in PHASES} if rows else None
    for key in ("run_seconds", "server_start_seconds"):
        if all(key in r for r in runs):
            out[key] = round(statistics.median(r[key] for r in runs), 1)
    return out


def markdown(result: dict[str, Any]) -> str:
    """The table of docs/scale-out.md: seconds per phase, cold and warm, both backends."""
    lines = [
        "| phase | tinker cold | tinker warm | local cold | local warm |",
        "|---|---:|---:|---:|---:|",
    ]
    t, loc = result["tinker"]["median"], result["local"]["median"]
    names = {"rollout": "rollouts (16)", "update": "update", "publish": "publish", "step": "whole step"}
    for p in PHASES:
        cells = [f"{side[kind][p]:.2f}" if side[kind] else "–" for side in (t, loc) for kind in ("cold", "warm")]
        lines.append(f"| {names[p]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per backend")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per run (the first is the cold one)")
    parser.add_argument("--markdown", action="store_true", help="also print the docs table on stderr")
    parser.add_argument("--keep", type=Path, help="write the runs (server logs, metrics) here and keep them")
    args = parser.parse_args()
    if not (SERVER_PROJECT / ".venv").is_dir():  # `make bench` runs every bench: this one needs an opt-in install
        print(json.dumps({"skipped": "no SkyRL server environment: run scripts/setup_scale_env.sh"}))
        return

    model = qwen3_twin()
    runs: dict[str, list[dict[str, Any]]] = {"tinker": [], "local": []}
    with tempfile.TemporaryDirectory(prefix="agentgrad-bench-tinker-") as tmp:
        work = args.keep or Path(tmp)
        for i in range(args.runs):
            for backend in runs:
                with contextlib.redirect_stdout(sys.stderr):  # the run's progress; stdout is the JSON
                    run = one_run(backend, model, work / f"{backend}-{i}", args.steps)
                runs[backend].append(run)
                print(f"{backend} run {i + 1}/{args.runs}: {json.dumps(run)}", file=sys.stderr, flush=True)
    result = {
        "tinker": {"median": medians(runs["tinker"]), "runs": runs["tinker"]},
        "local": {"median": medians(runs["local"]), "runs": runs["local"]},
        "runs_per_backend": args.runs,
        "steps_per_run": args.steps,
        "model": model.name,
        **DESCRIPTION,
    }
    print(json.dumps(result, indent=2))
    if args.markdown:
        print(markdown(result), file=sys.stderr)


if __name__ == "__main__":
    main()
