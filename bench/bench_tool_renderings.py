"""Does the tiny model call its tool whatever framework renders it? Greedy tool-call rate and
success on held-out problems, per framework rendering (``agentgrad.demo.renderings``).

Runs the in-process mirror of the agent loop (``tiny.evaluate_greedy``: the same chat template,
calculator and scoring as through the server) once per rendering: the captured framework
renderings, then the held-out ones no warm-up saw. Prints one JSON object.

    .venv/bin/python bench/bench_tool_renderings.py [MODEL_DIR] [--problems 128] [--seed 0]

MODEL_DIR defaults to the build the package ships.
"""

from __future__ import annotations

import argparse
import json
import time

from agentgrad.demo import calc, tiny
from agentgrad.demo.renderings import FRAMEWORKS, HELD_OUT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default=str(tiny.SHIPPED_MODEL_DIR))
    parser.add_argument("--problems", type=int, default=128, help="held-out test problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    problems = calc.generate_problems(args.problems, args.seed, "test")
    started = time.monotonic()
    results = {}
    for group, renderings in (("frameworks", FRAMEWORKS), ("held_out", HELD_OUT)):
        results[group] = {
            name: {k: round(v, 3) for k, v in tiny.evaluate_greedy(model, tokenizer, problems, rendering=r).items()}
            for name, r in renderings.items()
        }
    build = json.loads((tiny.Path(args.model) / "agentgrad_build.json").read_text())
    print(
        json.dumps(
            {
                "model": args.model,
                "format": build.get("format"),
                "problems": len(problems),
                "split": "test",
                "seed": args.seed,
                **results,
                "seconds": round(time.monotonic() - started, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
