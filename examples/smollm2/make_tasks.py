"""Write the arithmetic tasks: ``python make_tasks.py OUT_DIR`` → train.jsonl (600), val.jsonl (48),
test.jsonl (64); deterministic, and no question is in two splits.

Small additions and subtractions (1–20 ± 1–9), written three ways ("What is 7 + 5?", "Compute
7 - 5.", "How much is 7 plus 5?"): SmolLM2-135M-Instruct gets about a fifth right greedily at the
start, so GRPO's groups disagree often enough to learn from.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

FORMS = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "How much is {a} {word} {b}?")
SPLITS = (("test", 1, 64), ("val", 2, 48), ("train", 3, 600))  # (name, seed, size); test first


def problems(seed: int, n: int, taken: set[str]) -> list[dict[str, object]]:
    """``n`` questions from ``seed`` that are not in ``taken`` (which grows by them)."""
    rng, out = random.Random(seed), []
    while len(out) < n:
        a, b = rng.randint(1, 20), rng.randint(1, 9)
        op, word = rng.choice((("+", "plus"), ("-", "minus")))
        question = rng.choice(FORMS).format(a=a, b=b, op=op, word=word)
        if question not in taken:
            taken.add(question)
            out.append({"question": question, "answer": a + b if op == "+" else a - b})
    return out


def main(out_dir: str) -> None:
    out, taken = Path(out_dir), set[str]()
    out.mkdir(parents=True, exist_ok=True)
    for name, seed, size in SPLITS:
        rows = problems(seed, size, taken)
        (out / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"{name}: {len(rows)} tasks -> {out / f'{name}.jsonl'}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/smollm2-tasks")
