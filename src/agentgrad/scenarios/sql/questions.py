"""Questions about one database, with gold SQL, in four grades of difficulty.

The grades follow Spider's (easy, medium, hard, extra) in spirit:

========  ==================================================================================
easy      one table: count its rows, list a column, filter on a category or a number
medium    one table: count with a filter, an aggregate (average, highest, lowest, total),
          group by, distinct values, ordering (all rows, the top one, the top three)
hard      two tables: a join with a filter on the other table, counts and totals over a join
extra     a join with group by (per parent, its children counted; the parent with the most),
          three tables through a bridge table (the products a customer ordered)
========  ==================================================================================

Every gold query is run on the database while the question is made: a question whose answer is
empty, too long to show (more than :data:`MAX_ANSWER_ROWS` rows), all NULL, or — for questions
whose order is compared — not one order only (ties), is not asked. The templates know only the
kinds of columns (``schemas.py``), so they work on every schema.
"""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agentgrad.scenarios.sql.database import BoundTable, Database
from agentgrad.scenarios.sql.reward import order_matters
from agentgrad.scenarios.sql.schemas import Column

DIFFICULTIES = ("easy", "medium", "hard", "extra")
#: Answers longer than this are not asked for: the agent's checker sees the result.
MAX_ANSWER_ROWS = 20


@dataclass(frozen=True)
class Question:
    question: str
    #: The gold SQL (Spider's name for it).
    query: str
    #: Whether the answer's row order is compared (the gold query has ORDER BY).
    ordered: bool
    difficulty: str
    #: The template that made it (``count``, ``join_filter``…): per-skill figures.
    skill: str


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") and noun[-2:-1] not in "aeiou" else noun + "s"


def _literal(value: Any) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else str(value)


def _of(table: BoundTable, kind: str) -> list[Column]:
    return [c for c in table.table.columns if c.kind == kind]


_AGGREGATES = (("average", "AVG"), ("highest", "MAX"), ("lowest", "MIN"), ("total", "SUM"))

Candidate = tuple[str, str, str, str]  # (difficulty, skill, question, query)


def _single_table(db: Database, t: BoundTable, rng: random.Random) -> Iterator[Candidate]:
    name, things = t.sql, t.table.plural
    yield "easy", "count", f"How many {things} are there?", f"SELECT count(*) FROM {name}"
    labels = _of(t, "label")
    for label in labels:
        lsql, lnoun = t.column(label), _plural(label.noun)
        yield "easy", "list", f"List the {lnoun} of all {things}.", f"SELECT {lsql} FROM {name}"
        for cat in _of(t, "category"):
            value = rng.choice([v for v in t.values(cat) if v is not None])
            where = f"WHERE {t.column(cat)} = {_literal(value)}"
            yield (
                "easy",
                "filter",
                f"List the {lnoun} of {things} whose {cat.noun} is {value}.",
                f"SELECT {lsql} FROM {name} {where}",
            )
        for num in _of(t, "number"):
            nsql, values = t.column(num), [v for v in t.values(num) if v is not None]
            threshold = sorted(values)[len(values) // 2]
            yield (
                "easy",
                "filter_number",
                f"List the {lnoun} of {things} whose {num.noun} is greater than {threshold}.",
                f"SELECT {lsql} FROM {name} WHERE {nsql} > {threshold}",
            )
            if len(set(values)) == len(t.rows):  # every row has its own value: one order only
                yield (
                    "medium",
                    "order",
                    f"List the {lnoun} of all {things} from the highest {num.noun} to the lowest.",
                    f"SELECT {lsql} FROM {name} ORDER BY {nsql} DESC",
                )
            ranked = sorted(values, reverse=True)
            if len(ranked) > 3 and len(set(ranked[:4])) == 4:
                yield (
                    "medium",
                    "top3",
                    (f"List the {lnoun} of the three {things} with the highest {num.noun}, highest first."),
                    f"SELECT {lsql} FROM {name} ORDER BY {nsql} DESC LIMIT 3",
                )
            for word, extreme, direction in (("highest", max, "DESC"), ("lowest", min, "ASC")):
                if values.count(extreme(values)) == 1:
                    skip_null = f" WHERE {nsql} IS NOT NULL" if None in t.values(num) else ""
                    yield (
                        "medium",
                        "top1",
                        (f"Which {t.table.singular} has the {word} {num.noun}? Give its {label.noun}."),
                        f"SELECT {lsql} FROM {name}{skip_null} ORDER BY {nsql} {direction} LIMIT 1",
                    )
    for cat in _of(t, "category"):
        csql = t.column(cat)
        value = rng.choice([v for v in t.values(cat) if v is not None])
        yield (
            "medium",
            "count_filter",
            f"How many {things} have {cat.noun} {value}?",
            f"SELECT count(*) FROM {name} WHERE {csql} = {_literal(value)}",
        )
        yield (
            "medium",
            "group_count",
            f"For each {cat.noun}, how many {things} are there?",
            f"SELECT {csql}, count(*) FROM {name} GROUP BY {csql}",
        )
        yield (
            "medium",
            "distinct",
            f"Which different {_plural(cat.noun)} do the {things} have?",
            f"SELECT DISTINCT {csql} FROM {name}",
        )
        for num in _of(t, "number"):
            word, function = rng.choice(_AGGREGATES)
            yield (
                "hard",
                "aggregate_filter",
                f"What is the {word} {num.noun} of {things} whose {cat.noun} is {value}?",
                f"SELECT {function}({t.column(num)}) FROM {name} WHERE {csql} = {_literal(value)}",
            )
    for num in _of(t, "number"):
        word, function = rng.choice(_AGGREGATES)
        yield (
            "medium",
            "aggregate",
            f"What is the {word} {num.noun} of all {things}?",
            f"SELECT {function}({t.column(num)}) FROM {name}",
        )


def _joins(db: Database, child: BoundTable, rng: random.Random) -> Iterator[Candidate]:
    refs = _of(child, "ref")
    for ref in refs:
        parent = db.table(ref.ref)
        on = f"FROM {child.sql} AS T1 JOIN {parent.sql} AS T2 ON T1.{child.column(ref)} = T2.id"
        (plabel,) = _of(parent, "label")
        psql = parent.column(plabel)
        who = rng.choice(parent.values(plabel))
        pname = f"the {parent.table.singular} {who}"
        where_who = f"WHERE T2.{psql} = {_literal(who)}"
        yield (
            "hard",
            "join_count",
            f"How many {child.table.plural} does {pname} have?",
            f"SELECT count(*) {on} {where_who}",
        )
        for num in _of(child, "number"):
            word, function = rng.choice(_AGGREGATES)
            yield (
                "hard",
                "join_aggregate",
                f"What is the {word} {num.noun} of the {child.table.plural} of {pname}?",
                f"SELECT {function}(T1.{child.column(num)}) {on} {where_who}",
            )
        for label in _of(child, "label"):
            lsql, lnoun = child.column(label), _plural(label.noun)
            yield (
                "hard",
                "join_label",
                f"List the {lnoun} of the {child.table.plural} of {pname}.",
                f"SELECT T1.{lsql} {on} {where_who}",
            )
            for cat in _of(parent, "category"):
                value = rng.choice([v for v in parent.values(cat) if v is not None])
                yield (
                    "hard",
                    "join_filter",
                    (
                        f"List the {lnoun} of {child.table.plural} whose "
                        f"{parent.table.singular}'s {cat.noun} is {value}."
                    ),
                    f"SELECT T1.{lsql} {on} WHERE T2.{parent.column(cat)} = {_literal(value)}",
                )
        counts = Counter(child.values(ref))
        yield (
            "extra",
            "join_group",
            (
                f"For each {parent.table.singular} that has {child.table.plural}, give its "
                f"{plabel.noun} and how many {child.table.plural} it has."
            ),
            f"SELECT T2.{psql}, count(*) {on} GROUP BY T2.id",
        )
        ranked = counts.most_common(2)
        if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
            yield (
                "extra",
                "join_most",
                (f"Which {parent.table.singular} has the most {child.table.plural}? Give its {plabel.noun}."),
                f"SELECT T2.{psql} {on} GROUP BY T2.id ORDER BY count(*) DESC LIMIT 1",
            )
    if len(refs) == 2:  # a bridge table: what one side has through it
        for this, that in (refs, refs[::-1]):
            one, other = db.table(this.ref), db.table(that.ref)
            (one_label,) = _of(one, "label")
            (other_label,) = _of(other, "label")
            who = rng.choice(one.values(one_label))
            yield (
                "extra",
                "bridge",
                (
                    f"Which {other.table.plural} appear in the {child.table.plural} of the "
                    f"{one.table.singular} {who}? List each {other_label.noun} once."
                ),
                (
                    f"SELECT DISTINCT T3.{other.column(other_label)} FROM {child.sql} AS T1 "
                    f"JOIN {one.sql} AS T2 ON T1.{child.column(this)} = T2.id "
                    f"JOIN {other.sql} AS T3 ON T1.{child.column(that)} = T3.id "
                    f"WHERE T2.{one.column(one_label)} = {_literal(who)}"
                ),
            )


_TEMPLATES: tuple[Callable[[Database, BoundTable, random.Random], Iterator[Candidate]], ...] = (_single_table, _joins)


def generate_questions(db: Database, n: int, rng: random.Random) -> list[Question]:
    """Up to ``n`` different questions about ``db``, the grades taken in turn (easy, medium, hard,
    extra, easy…) so every database has questions of every grade it can ask."""
    connection = sqlite3.connect(":memory:")
    try:
        db.fill(connection)
        pools: dict[str, list[Question]] = {grade: [] for grade in DIFFICULTIES}
        seen: set[str] = set()
        for table in db.tables:
            for template in _TEMPLATES:
                for difficulty, skill, text, query in template(db, table, rng):
                    if query in seen or not _answerable(connection, query):
                        continue
                    seen.add(query)
                    pools[difficulty].append(Question(text, query, order_matters(query), difficulty, skill))
    finally:
        connection.close()
    for pool in pools.values():
        rng.shuffle(pool)
    chosen: list[Question] = []
    while len(chosen) < n and any(pools.values()):
        for grade in DIFFICULTIES:
            if pools[grade] and len(chosen) < n:
                chosen.append(pools[grade].pop())
    return chosen


def _answerable(connection: sqlite3.Connection, query: str) -> bool:
    rows = connection.execute(query).fetchall()
    return 0 < len(rows) <= MAX_ANSWER_ROWS and any(v is not None for row in rows for v in row)
