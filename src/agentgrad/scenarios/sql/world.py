"""The SQL world: databases and questions, split into train / validation / test, written to disk.

Deterministic from the seed: every database has its own ``random.Random`` seeded from the world
seed and its id (a string seed: the same on every machine and Python process), so one database
never depends on how many others are made. Databases are dealt to the splits, each split getting
every schema in turn, and a database's questions stay in its split: the test set's databases are
ones training never saw (their rows, their SQL names), as Spider splits by database.

On disk (``write_world``)::

    OUT/world.json                   the settings and counts
    OUT/databases/<db_id>.sqlite     one SQLite file per database
    OUT/train.jsonl, val.jsonl, test.jsonl
                                     one task per line, for ``agentgrad train --tasks`` / ``--val``

A task is a plain dict: ``id``, ``db_id``, ``db_path`` (absolute: the agent opens it from any
directory; regenerate the world after moving it), ``schema`` (the tables in one short line each),
``question``, ``query`` (the gold SQL), ``ordered``, ``difficulty`` and ``skill``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentgrad.errors import InvalidInputError
from agentgrad.scenarios.sql.database import Database, generate_database
from agentgrad.scenarios.sql.questions import generate_questions
from agentgrad.scenarios.sql.schemas import SCHEMAS

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class WorldConfig:
    """How big a world to make."""

    seed: int = 0
    #: Databases per split (each split cycles through every schema).
    train_databases: int = 30
    val_databases: int = 5
    test_databases: int = 10
    #: Questions asked of each database (fewer when a database cannot give that many).
    questions_per_database: int = 12

    def __post_init__(self) -> None:
        for name in ("train_databases", "val_databases", "test_databases", "questions_per_database"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InvalidInputError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

    def databases(self, split: str) -> int:
        return {"train": self.train_databases, "val": self.val_databases, "test": self.test_databases}[split]


@dataclass(frozen=True)
class World:
    """A generated world in memory: each split's databases and tasks (tasks without ``db_path``,
    which only a written world has)."""

    config: WorldConfig
    databases: dict[str, list[Database]]
    tasks: dict[str, list[dict[str, Any]]]


def generate_world(config: WorldConfig | None = None) -> World:
    """The world ``config`` describes; the same config gives the same world."""
    config = config or WorldConfig()
    databases: dict[str, list[Database]] = {}
    tasks: dict[str, list[dict[str, Any]]] = {}
    number = 0
    for split in SPLITS:
        databases[split], tasks[split] = [], []
        for index in range(config.databases(split)):
            schema = SCHEMAS[index % len(SCHEMAS)]
            db_id = f"{schema.name}_{number:03d}"
            number += 1
            rng = random.Random(f"agentgrad-sql:{config.seed}:{db_id}")
            db = generate_database(schema, db_id, rng)
            databases[split].append(db)
            for q, question in enumerate(generate_questions(db, config.questions_per_database, rng)):
                tasks[split].append(
                    {"id": f"{db_id}/{q:02d}", "db_id": db_id, "schema": db.schema_text(), **asdict(question)}
                )
    return World(config, databases, tasks)


def write_world(out: str | Path, config: WorldConfig | None = None, *, overwrite: bool = False) -> World:
    """Generate the world and write it under ``out`` (see the module's layout); returns it with
    each task's ``db_path`` set. A directory that already holds a world is refused unless
    ``overwrite``."""
    root = Path(out).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise InvalidInputError(f"{out} exists and is not a directory")
    if (root / "world.json").exists() and not overwrite:
        raise InvalidInputError(f"{out} already holds a world (world.json): pass overwrite (--force) to replace it")
    world = generate_world(config)
    (root / "databases").mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        for db in world.databases[split]:
            db.write(root / "databases" / f"{db.db_id}.sqlite")
        for task in world.tasks[split]:
            task["db_path"] = str(root / "databases" / f"{task['db_id']}.sqlite")
        with open(root / f"{split}.jsonl", "w", encoding="utf-8") as file:
            file.writelines(json.dumps(task) + "\n" for task in world.tasks[split])
    summary = {
        "world": "sql",
        "config": asdict(world.config),
        "splits": {
            split: {"databases": [db.db_id for db in world.databases[split]], "tasks": len(world.tasks[split])}
            for split in SPLITS
        },
    }
    (root / "world.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return world
