"""The engine's prefix caching on a GRPO step's rollouts: the same requests with it off and on.

Prints one JSON object. The workload is what a GRPO step asks of the engine for a two-turn agent:
``--tasks`` calculator prompts (the system turn with the tool's schema, one question each), each
sent ``--group`` times and sampled at temperature 1 with its own seed (turn 1); then every
rollout's prompt, its completion and a tool result, sampled again (turn 2). Each round runs the
workload on a fresh engine with ``prefix_caching=False`` (every prompt prefilled whole) and
then with it on (the default), so the two settings alternate on a noisy machine. Reported per
turn: wall seconds, prompt tokens run through forward passes (``prefill_tokens``) and taken from
shared or cached prefixes (``reused_prompt_tokens``), and the fraction of rollouts whose sampled
tokens are the same in both settings (``same_tokens_as_off``). The draws are seeded, so only a
draw that falls within floating-point noise of the boundary between two tokens can differ; how
often that happens without prefix caching at all, between two runs of the same requests batched
as the engine happened to admit them, is ``same_tokens_off_twice`` (each round's run with it off
against the first round's).

    python bench/bench_prefix_cache.py [--model tiny|DIR] [--tasks 16] [--group 8] [--max-tokens 48] [--rounds 2]
    python bench/bench_prefix_cache.py --model "$(agentgrad models smollm2 | tail -n 1)"   # SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

TOOL_RESULT = "\n<tool_response>\n42\n</tool_response>\n"


def _run(engine: Any, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[Any]]:
    from agentgrad.inference import SamplingParams

    started = time.perf_counter()
    futures = [
        engine.submit(p, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i)) for i, p in enumerate(prompts)
    ]
    results = [f.result() for f in futures]
    return time.perf_counter() - started, results


def _workload(model_dir: str, prompts: list[list[int]], args: argparse.Namespace, caching: bool) -> dict[str, Any]:
    from agentgrad.inference import Engine

    engine = Engine(model_dir, max_batch_size=len(prompts), prefix_caching=caching)
    try:
        report: dict[str, Any] = {"prefix_caching": caching}
        tool_result = engine.tokenizer.encode(TOOL_RESULT, add_special_tokens=False)
        for turn in (1, 2):
            prefilled, reused = engine.prefill_tokens, engine.reused_prompt_tokens
            seconds, results = _run(engine, prompts, args.max_tokens)
            report[f"turn{turn}"] = {
                "seconds": round(seconds, 2),
                "prompt_tokens": sum(map(len, prompts)),
                "prefill_tokens": engine.prefill_tokens - prefilled,
                "reused_prompt_tokens": engine.reused_prompt_tokens - reused,
                "completion_tokens": sum(len(r.token_ids) for r in results),
            }
            report[f"turn{turn}_tokens"] = [r.token_ids for r in results]
            prompts = [p + r.token_ids + tool_result for p, r in zip(prompts, results, strict=True)]
        return report
    finally:
        engine.close()


def _same(a: list[list[int]], b: list[list[int]]) -> float:
    """The fraction of rollouts whose tokens are the same in ``a`` and ``b``."""
    return round(sum(x == y for x, y in zip(a, b, strict=True)) / len(a), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (the demo's model) or a model directory")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="rollouts per task")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from agentgrad.cli.named_models import resolve_model
    from agentgrad.demo import calc

    torch.set_num_threads(args.threads)
    model_dir = str(resolve_model(args.model))
    tok = AutoTokenizer.from_pretrained(model_dir)
    questions = [calc.prompt_ids(tok, p["question"]) for p in calc.generate_problems(args.tasks, seed=0, split="test")]
    prompts = [q for q in questions for _ in range(args.group)]
    rounds: list[dict[str, Any]] = []
    first_off: dict[str, list[list[int]]] = {}
    for index in range(args.rounds):
        off, on = (_workload(model_dir, prompts, args, caching) for caching in (False, True))
        for turn in ("turn1", "turn2"):
            off_tokens = off.pop(f"{turn}_tokens")
            on[turn]["same_tokens_as_off"] = _same(off_tokens, on.pop(f"{turn}_tokens"))
            if index:
                off[turn]["same_tokens_off_twice"] = _same(first_off[turn], off_tokens)
            else:
                first_off[turn] = off_tokens
        rounds.append({"off": off, "on": on})
    speedups = {
        turn: [round(r["off"][turn]["seconds"] / r["on"][turn]["seconds"], 2) for r in rounds]
        for turn in ("turn1", "turn2")
    }
    report = {
        "model": model_dir,
        "tasks": args.tasks,
        "group": args.group,
        "max_tokens": args.max_tokens,
        "torch_threads": args.threads,
        "prompt_tokens_mean": round(statistics.mean(map(len, prompts)), 1),
        "rounds": rounds,
        "speedup": speedups,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
