"""A split on disk: the corpus (JSONL) with its search index, and the tasks (JSONL) about it.

``agentgrad train`` reads tasks from a file, and a runner process needs the corpus, so each task
names its corpus file by absolute path (``"corpus"``): the task files work from any directory,
on this machine (regenerate them, deterministically, after moving the folder).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import chain, zip_longest
from pathlib import Path
from typing import Any

from agentgrad.errors import InvalidInputError
from agentgrad.scenarios.rag.search import build_index
from agentgrad.scenarios.rag.world import SPLITS, Question, Split, generate_split

#: Questions written per split unless asked otherwise (half 1-hop, half 2-hop).
DEFAULT_QUESTIONS = {"train": 2000, "val": 64, "test": 200}


@dataclass(frozen=True)
class SplitFiles:
    """The files of one written split."""

    split: str
    tasks: Path
    corpus: Path
    index: Path
    documents: int
    questions: int
    #: The split the files were written from (so that a caller need not generate it again).
    world: Split = field(repr=False, compare=False)


def balanced(questions: tuple[Question, ...], n: int) -> list[Question]:
    """The first ``n`` of ``questions`` taken alternately from the 1-hop and the 2-hop ones."""
    one = [q for q in questions if q.hops == 1]
    two = [q for q in questions if q.hops == 2]
    mixed = [q for q in chain.from_iterable(zip_longest(one, two)) if q is not None]
    if n > len(mixed):
        raise InvalidInputError(f"asked for {n} questions; this split has {len(mixed)}")
    return mixed[:n]


def task_of(question: Question, corpus: Path) -> dict[str, Any]:
    """The task dict an agent receives: the question, its gold answer and its corpus file."""
    return {**question.to_dict(), "corpus": str(corpus.resolve())}


def write_split(out_dir: str | Path, split: str, seed: int = 0, questions: int | None = None) -> SplitFiles:
    """Write ``split``'s corpus, index and tasks into ``out_dir`` (``corpus-SPLIT.jsonl``, ``SPLIT.jsonl``)."""
    if split not in SPLITS:
        raise InvalidInputError(f"split must be one of {SPLITS}, got {split!r}")
    if questions is not None and questions < 1:
        raise InvalidInputError(f"questions must be at least 1, got {questions}")
    world = generate_split(split, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus, tasks = out / f"corpus-{split}.jsonl", out / f"{split}.jsonl"
    corpus.write_text("".join(json.dumps(d.to_dict()) + "\n" for d in world.documents), encoding="utf-8")
    chosen = balanced(world.questions, DEFAULT_QUESTIONS[split] if questions is None else questions)
    tasks.write_text("".join(json.dumps(task_of(q, corpus)) + "\n" for q in chosen), encoding="utf-8")
    return SplitFiles(split, tasks, corpus, build_index(corpus), len(world.documents), len(chosen), world)


def write_world(out_dir: str | Path, seed: int = 0, questions: dict[str, int] | None = None) -> list[SplitFiles]:
    """Write every split (``questions`` overrides the count of the splits it names) and
    ``world.json``, the settings that regenerate it."""
    counts = {**DEFAULT_QUESTIONS, **(questions or {})}
    for split, n in counts.items():  # every count checked before anything is written
        if split not in SPLITS or n < 1:
            raise InvalidInputError(f"questions: {split}={n!r}; give each of {SPLITS} at least 1")
    written = [write_split(out_dir, split, seed, counts[split]) for split in SPLITS]
    settings = {"world": "rag", "seed": seed, "questions": counts, "documents": {f.split: f.documents for f in written}}
    (Path(out_dir) / "world.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return written
