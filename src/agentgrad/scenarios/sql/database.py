"""One generated database: a schema with SQL names picked for it, its rows, and its SQLite file.

Everything comes from the ``random.Random`` it is given, so a database is a pure function of its
seed: the world generator (``world.py``) seeds one per database id.
"""

from __future__ import annotations

import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgrad.scenarios.sql.schemas import Column, Schema, Table


@dataclass(frozen=True)
class BoundTable:
    """A table of one database: its SQL name, its columns' SQL names (``id`` first) and its rows."""

    table: Table
    sql: str
    #: SQL name of each column of ``table.columns``, in order (the ``id`` column is not in it).
    column_sql: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def column(self, column: Column) -> str:
        return self.column_sql[self.table.columns.index(column)]

    def values(self, column: Column) -> list[Any]:
        """The column's value in every row, in row order."""
        position = 1 + self.table.columns.index(column)
        return [row[position] for row in self.rows]


@dataclass(frozen=True)
class Database:
    """A generated database; :meth:`write` puts it in a SQLite file."""

    db_id: str
    schema: Schema
    tables: tuple[BoundTable, ...]

    def table(self, key: str) -> BoundTable:
        return next(t for t in self.tables if t.table.key == key)

    def ddl(self) -> list[str]:
        """``CREATE TABLE`` statements, parents first, with their foreign keys."""
        statements = []
        for bound in self.tables:
            lines = ["id INTEGER PRIMARY KEY"]
            foreign = []
            for column, name in zip(bound.table.columns, bound.column_sql, strict=True):
                kind = "TEXT" if column.kind in ("label", "category") else "INTEGER"
                lines.append(f"{name} {kind}" + (" NOT NULL" if column.kind in ("label", "ref") else ""))
                if column.kind == "ref":
                    foreign.append(f"FOREIGN KEY ({name}) REFERENCES {self.table(column.ref).sql}(id)")
            statements.append(f"CREATE TABLE {bound.sql} (\n  " + ",\n  ".join(lines + foreign) + "\n)")
        return statements

    def schema_text(self) -> str:
        """The schema in one short line per table, as a prompt shows it: ``orders(id, customer_id ->
        customers.id, quantity)``. Short on purpose: small models have small contexts."""
        lines = []
        for bound in self.tables:
            columns = ["id"] + [
                name + (f" -> {self.table(column.ref).sql}.id" if column.kind == "ref" else "")
                for column, name in zip(bound.table.columns, bound.column_sql, strict=True)
            ]
            lines.append(f"{bound.sql}({', '.join(columns)})")
        return "\n".join(lines)

    def fill(self, connection: sqlite3.Connection) -> None:
        """Create the tables and insert the rows into ``connection`` (a file or ``:memory:``)."""
        for statement in self.ddl():
            connection.execute(statement)
        for bound in self.tables:
            marks = ", ".join("?" * (1 + len(bound.column_sql)))
            connection.executemany(f"INSERT INTO {bound.sql} VALUES ({marks})", bound.rows)
        connection.commit()

    def write(self, path: Path) -> None:
        """Write the database to ``path`` (replacing a file there)."""
        path.unlink(missing_ok=True)
        connection = sqlite3.connect(path)
        try:
            self.fill(connection)
        finally:
            connection.close()


def generate_database(schema: Schema, db_id: str, rng: random.Random) -> Database:
    """A database of ``schema``: SQL names and rows drawn from ``rng``."""
    tables: list[BoundTable] = []
    for table in schema.tables:
        size = rng.randint(*table.rows)
        labels = {column: rng.sample(column.values, size) for column in table.columns if column.kind == "label"}
        rows = []
        for index in range(size):
            row: list[Any] = [index + 1]
            for column in table.columns:
                row.append(_value(column, index, labels, tables, rng))
            rows.append(tuple(row))
        tables.append(
            BoundTable(table, rng.choice(table.names), tuple(rng.choice(c.names) for c in table.columns), tuple(rows))
        )
    return Database(db_id, schema, tuple(tables))


def _value(
    column: Column, index: int, labels: dict[Column, list[str]], parents: list[BoundTable], rng: random.Random
) -> Any:
    if column.kind == "label":
        return labels[column][index]
    if column.kind == "ref":
        parent = next(t for t in parents if t.table.key == column.ref)
        return rng.randint(1, len(parent.rows))
    if column.null_rate and rng.random() < column.null_rate:
        return None
    if column.kind == "category":
        return rng.choice(column.values)
    return rng.randint(column.low, column.high)
