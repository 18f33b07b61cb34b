"""``agentgrad scenarios``: write the paper's scenario worlds to disk, offline and from a seed.

``agentgrad scenarios WORLD generate OUT --seed N`` writes one world: its task files
(``train.jsonl``, ``val.jsonl``, ``test.jsonl``, read by ``agentgrad train --tasks/--val``), what
the tasks need (SQLite databases, documents) and a ``world.json`` of the settings. The same seed
gives the same world. Each world registers its own sub-command below (``_WORLDS``).
"""

from __future__ import annotations

import argparse
from typing import Any


def _generate_parser(
    worlds: Any, world: str, help: str, generate_help: str, description: str, seed_default: int = 0
) -> argparse.ArgumentParser:
    """``agentgrad scenarios WORLD generate OUT --seed N``: the part every world shares."""
    actions = worlds.add_parser(world, help=help).add_subparsers(dest="action", metavar="ACTION", required=True)
    generate = actions.add_parser("generate", help=generate_help, description=description)
    generate.add_argument("out", metavar="OUT", help="directory to write (created if missing)")
    generate.add_argument("--seed", type=int, default=seed_default, help=f"world seed (default {seed_default})")
    return generate


def _cmd_sql_generate(args: argparse.Namespace) -> int:
    from agentgrad.scenarios.sql.world import SPLITS, WorldConfig, write_world

    config = WorldConfig(
        seed=args.seed,
        train_databases=args.train_databases,
        val_databases=args.val_databases,
        test_databases=args.test_databases,
        questions_per_database=args.questions,
    )
    world = write_world(args.out, config, overwrite=args.force)
    for split in SPLITS:
        print(
            f"{split}: {len(world.tasks[split])} tasks over {len(world.databases[split])} databases "
            f"-> {args.out}/{split}.jsonl"
        )
    return 0


def _add_sql(worlds: Any) -> None:
    from agentgrad.scenarios.sql.world import WorldConfig

    defaults = WorldConfig()
    generate = _generate_parser(
        worlds,
        "sql",
        "text-to-SQL: generated SQLite databases and questions with gold SQL",
        "write databases and train/val/test task files",
        "Write the SQL world under OUT: databases/<db_id>.sqlite, train/val/test.jsonl (the splits never share "
        "a database) and world.json.",
        defaults.seed,
    )
    generate.add_argument(
        "--train-databases",
        type=int,
        default=defaults.train_databases,
        help=f"databases in the train split (default {defaults.train_databases})",
    )
    generate.add_argument(
        "--val-databases",
        type=int,
        default=defaults.val_databases,
        help=f"databases in the validation split (default {defaults.val_databases})",
    )
    generate.add_argument(
        "--test-databases",
        type=int,
        default=defaults.test_databases,
        help=f"databases in the test split (default {defaults.test_databases})",
    )
    generate.add_argument(
        "--questions",
        type=int,
        default=defaults.questions_per_database,
        help=f"questions per database (default {defaults.questions_per_database})",
    )
    generate.add_argument("--force", action="store_true", help="replace a world already in OUT")
    generate.set_defaults(func=_cmd_sql_generate)


def _add_split_counts(generate: argparse.ArgumentParser, defaults: dict[str, int], noun: str) -> None:
    """``--train N --val N --test N``: how many tasks each split's file gets."""
    for split, default in defaults.items():
        generate.add_argument(
            f"--{split}",
            type=int,
            default=default,
            metavar="N",
            help=f"{noun} in the {split} split (default {default})",
        )


def _cmd_rag_generate(args: argparse.Namespace) -> int:
    from agentgrad.scenarios.rag.files import write_world

    for split in write_world(args.out, args.seed, {"train": args.train, "val": args.val, "test": args.test}):
        print(f"{split.split}: {split.questions} tasks over {split.documents} documents -> {split.tasks}")
    return 0


def _add_rag(worlds: Any) -> None:
    from agentgrad.scenarios.rag.files import DEFAULT_QUESTIONS

    generate = _generate_parser(
        worlds,
        "rag",
        "retrieval: a generated encyclopedia and 1- and 2-hop questions",
        "write the corpora, their search indexes and train/val/test task files",
        "Write the RAG world under OUT: corpus-<split>.jsonl with its FTS5 index (the splits never share a "
        "document), train/val/test.jsonl (half 1-hop, half 2-hop questions) and world.json.",
    )
    _add_split_counts(generate, DEFAULT_QUESTIONS, "questions")
    generate.set_defaults(func=_cmd_rag_generate)


def _cmd_math_generate(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from agentgrad.demo.calc import generate_problems
    from agentgrad.errors import InvalidInputError

    for split in ("train", "val", "test"):
        if getattr(args, split) < 1:
            raise InvalidInputError(f"--{split} must be at least 1, got {getattr(args, split)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        problems = generate_problems(getattr(args, split), args.seed, split)
        (out / f"{split}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in problems), encoding="utf-8")
        print(f"{split}: {len(problems)} tasks -> {out / f'{split}.jsonl'}")
    return 0


def _add_math(worlds: Any) -> None:
    generate = _generate_parser(
        worlds,
        "math",
        "the calculator task of `agentgrad demo` (examples/math)",
        "write train/val/test task files of the calculator task",
        "Write train/val/test.jsonl of agentgrad.demo.calc's problems under OUT (the splits never share a question).",
    )
    _add_split_counts(generate, {"train": 4000, "val": 64, "test": 128}, "problems")
    generate.set_defaults(func=_cmd_math_generate)


#: One function per world, each adding its sub-command to ``agentgrad scenarios``.
_WORLDS = (_add_sql, _add_rag, _add_math)


def add_commands(subparsers: Any) -> None:
    """Register ``agentgrad scenarios`` (the main CLI calls this)."""
    parser = subparsers.add_parser(
        "scenarios",
        help="write the scenario worlds (sql, rag, math) to disk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worlds = parser.add_subparsers(dest="world", metavar="WORLD", required=True)
    for add_world in _WORLDS:
        add_world(worlds)
