"""The SQL world's generator: deterministic from its seed, splits that never share a database,
well-formed databases and questions whose gold queries run, and the ``agentgrad scenarios`` command."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from agentgrad.cli import main
from agentgrad.errors import InvalidInputError
from agentgrad.scenarios.sql.questions import DIFFICULTIES
from agentgrad.scenarios.sql.reward import execution_match
from agentgrad.scenarios.sql.schemas import SCHEMAS
from agentgrad.scenarios.sql.world import SPLITS, WorldConfig, generate_world, write_world
from agentgrad.tasks import read_tasks

SMALL = WorldConfig(seed=0, train_databases=5, val_databases=2, test_databases=3, questions_per_database=8)


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sql") / "world"
    write_world(out, SMALL)
    return out


def _dump(path: Path) -> list[str]:
    connection = sqlite3.connect(path)
    try:
        return list(connection.iterdump())
    finally:
        connection.close()


def test_same_seed_same_world_on_disk(world_dir: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    write_world(again, SMALL)
    for split in SPLITS:
        first, second = read_tasks(world_dir / f"{split}.jsonl"), read_tasks(again / f"{split}.jsonl")
        assert [{**t, "db_path": None} for t in first] == [{**t, "db_path": None} for t in second]
    for path in sorted((world_dir / "databases").iterdir()):
        assert _dump(path) == _dump(again / "databases" / path.name), path.name


def test_another_seed_another_world() -> None:
    one, other = generate_world(SMALL), generate_world(WorldConfig(**{**SMALL.__dict__, "seed": 1}))
    assert one.tasks["train"] != other.tasks["train"]
    assert [db.tables for db in one.databases["test"]] != [db.tables for db in other.databases["test"]]


def test_splits_never_share_a_database(world_dir: Path) -> None:
    summary = json.loads((world_dir / "world.json").read_text())
    owners: dict[str, str] = {}
    for split in SPLITS:
        databases = summary["splits"][split]["databases"]
        assert len(databases) == SMALL.databases(split)
        for db_id in databases:
            assert db_id not in owners, f"{db_id} is in {owners.get(db_id)} and {split}"
            owners[db_id] = split
        tasks = read_tasks(world_dir / f"{split}.jsonl")
        assert {t["db_id"] for t in tasks} == set(databases)  # a database's questions stay in its split
        assert {Path(t["db_path"]).name for t in tasks} == {f"{d}.sqlite" for d in databases}
        assert len({t["id"] for t in tasks}) == len(tasks) == summary["splits"][split]["tasks"]
    assert sorted(p.stem for p in (world_dir / "databases").iterdir()) == sorted(owners)


def test_databases_have_their_schema_foreign_keys_and_rows(world_dir: Path) -> None:
    for path in sorted((world_dir / "databases").iterdir()):
        schema = next(s for s in SCHEMAS if path.stem.startswith(s.name + "_"))
        connection = sqlite3.connect(path)
        try:
            tables = [name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            assert 2 <= len(tables) == len(schema.tables) <= 4, (path.name, tables)
            foreign = [row for table in tables for row in connection.execute(f"PRAGMA foreign_key_list({table})")]
            assert foreign, f"{path.name} has no foreign key"
            assert connection.execute("PRAGMA foreign_key_check").fetchall() == []  # every reference resolves
            assert all(connection.execute(f"SELECT count(*) FROM {t}").fetchone()[0] > 0 for t in tables)
        finally:
            connection.close()


def test_every_gold_query_matches_itself_and_grades_are_mixed(world_dir: Path) -> None:
    tasks = [t for split in SPLITS for t in read_tasks(world_dir / f"{split}.jsonl")]
    for task in tasks:
        score = execution_match(task["query"], task["query"], task["db_path"])
        assert score.reward == 1.0, (task["id"], score)
        assert task["ordered"] == ("ORDER BY" in task["query"]), task["query"]
        assert task["schema"].count("\n") + 1 in (2, 3, 4) and task["question"].endswith(("?", "."))
    grades = Counter(t["difficulty"] for t in tasks)
    assert set(grades) == set(DIFFICULTIES) and min(grades.values()) >= len(tasks) // 8, grades
    assert any("JOIN" in t["query"] for t in tasks) and any("GROUP BY" in t["query"] for t in tasks)


def test_databases_of_one_schema_differ_in_names_or_rows() -> None:
    world = generate_world(WorldConfig(train_databases=10, val_databases=1, test_databases=1))
    shops = [db for db in world.databases["train"] if db.schema.name == "shop"]
    assert len(shops) == 2 and shops[0].tables != shops[1].tables


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="questions_per_database"):
        WorldConfig(questions_per_database=0)
    with pytest.raises(InvalidInputError, match="train_databases"):
        WorldConfig(train_databases=-1)


def test_the_command_writes_a_world_and_will_not_overwrite_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w"
    argv = [
        "scenarios",
        "sql",
        "generate",
        str(out),
        "--seed",
        "3",
        "--train-databases",
        "2",
        "--val-databases",
        "1",
        "--test-databases",
        "1",
        "--questions",
        "4",
    ]
    assert main(argv) == 0
    assert "train: 8 tasks over 2 databases" in capsys.readouterr().out
    assert json.loads((out / "world.json").read_text())["config"]["seed"] == 3
    assert main(argv) == 1
    assert "already holds a world" in capsys.readouterr().err
    assert main([*argv, "--force"]) == 0
    assert main(["scenarios", "sql", "generate", str(tmp_path / "x"), "--questions", "0"]) == 1
    assert "questions_per_database must be a positive integer" in capsys.readouterr().err
