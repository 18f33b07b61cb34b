"""The SQL world's reward: execution match, run safely.

The rule is the reference's (Spider's execution accuracy, as the test-suite evaluation computes
it and Agent Lightning's Spider example uses it): run the predicted and the gold query on the
database and compare the results as **multisets of rows** — row order ignored, duplicates
counted — unless the gold query has an ``ORDER BY``, when the order is compared too. Columns may
come in another order (``SELECT b, a`` for ``SELECT a, b``), as in the test-suite evaluation;
their number and every value must match (``1`` equals ``1.0``; floats are compared to 9 decimal
places, because ``AVG`` and ``SUM(x) / count(*)`` differ in the last bits).

A model writes queries that fail in every way, so the predicted query runs under guard: a
read-only connection (a ``mode=ro`` URI and ``PRAGMA query_only``; no ``ATTACH``), a time budget
enforced by SQLite's progress handler, a cap on the rows fetched and on the size of any value. A query that
errors, runs past its budget or returns too many rows scores 0 with a message saying which —
never an exception, never a hung runner.
"""

from __future__ import annotations

import itertools
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Seconds a query may run (the gold queries of the generated world take well under 10 ms).
TIMEOUT_SECONDS = 2.0
#: Rows a query may return; one more is an error (a cross join of every table, a runaway CTE).
MAX_ROWS = 10_000
#: Bytes any one value may have (``zeroblob(1e9)`` is refused by SQLite, not allocated).
MAX_VALUE_BYTES = 1_000_000
#: SQLite virtual-machine instructions between two looks at the clock.
_PROGRESS_STEPS = 10_000
#: Column orders tried before two results are called different (6 alike columns: 720).
_MAX_COLUMN_ORDERS = 5040


@dataclass(frozen=True)
class Execution:
    """A query's result, or why there is none."""

    rows: list[tuple[Any, ...]] | None
    error: str | None = None


@dataclass(frozen=True)
class SQLScore:
    """The reward (1.0 or 0.0) and a message a person can read in the span."""

    reward: float
    message: str


def run_query(
    db_path: str | Path, query: str, *, timeout: float = TIMEOUT_SECONDS, max_rows: int = MAX_ROWS
) -> Execution:
    """``query``'s rows on the database at ``db_path``, read-only, within ``timeout`` seconds and
    ``max_rows`` rows; an :class:`Execution` with ``error`` set otherwise (never raises for a bad
    query)."""
    if not query or not query.strip():
        return Execution(None, "empty query")
    path = Path(db_path)
    if not path.is_file():  # mode=ro never creates a file, but say plainly what is missing
        return Execution(None, f"no database at {path}")
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:  # unreadable: a permission, a lock
        return Execution(None, f"cannot open {path}: {exc}")
    deadline = time.monotonic() + timeout
    try:
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # ATTACH would open (or create) another file
        connection.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
        cursor = connection.execute(query)
        rows: list[tuple[Any, ...]] = []
        while batch := cursor.fetchmany(1000):
            rows.extend(batch)
            if len(rows) > max_rows:
                return Execution(None, f"more than {max_rows} rows")
        return Execution(rows)
    except sqlite3.OperationalError as exc:
        if str(exc) == "interrupted" and time.monotonic() > deadline:
            return Execution(None, f"timed out after {timeout:g} s")
        return Execution(None, f"error: {exc}")
    except (sqlite3.Error, sqlite3.Warning, OverflowError, ValueError, MemoryError) as exc:
        return Execution(None, f"error: {exc}")
    finally:
        connection.close()


def order_matters(gold: str) -> bool:
    """Whether the gold query's outermost result is ordered (``ORDER BY``), read with ``sqlglot``;
    a query sqlglot cannot parse falls back to the reference's test, ``order by`` in the text."""
    import sqlglot  # the `scenarios` extra
    from sqlglot import expressions

    try:
        tree = sqlglot.parse_one(gold, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return re.search(r"\border\s+by\b", gold, re.IGNORECASE) is not None
    return isinstance(tree, expressions.Query) and tree.args.get("order") is not None


def _value(value: Any) -> Any:
    return round(value, 9) if isinstance(value, float) else value


def _key(value: Any) -> tuple[int, float, str]:
    """A sort key for any SQLite value; numbers by value, so ``1`` and ``1.0`` sort alike."""
    if isinstance(value, (int, float)):
        return 0, float(value), ""
    return (1, 0.0, "") if value is None else (2, 0.0, f"{type(value).__name__}:{value!r}")


def results_match(got: Sequence[tuple[Any, ...]], want: Sequence[tuple[Any, ...]], *, ordered: bool) -> bool:
    """Whether two results are the same: as multisets of rows (lists when ``ordered``), the columns
    of ``got`` in any order."""
    got = [tuple(map(_value, row)) for row in got]
    want = [tuple(map(_value, row)) for row in want]
    if len(got) != len(want):
        return False
    if not want:
        return True
    width = len(want[0])
    if any(len(row) != width for row in got):
        return False
    # every row must hold the same values in some column order: the cheap test that rules most out
    if Counter(tuple(sorted(row, key=_key)) for row in got) != Counter(tuple(sorted(row, key=_key)) for row in want):
        return False
    # column j of got can stand for column i of want only if the two hold the same values
    columns_got = [Counter(row[j] for row in got) for j in range(width)]
    columns_want = [Counter(row[i] for row in want) for i in range(width)]
    options = [[j for j in range(width) if columns_got[j] == columns_want[i]] for i in range(width)]
    target = want if ordered else Counter(want)
    for permutation in itertools.islice(itertools.product(*options), _MAX_COLUMN_ORDERS):
        if len(set(permutation)) < width:
            continue
        permuted = [tuple(row[j] for j in permutation) for row in got]
        if (permuted if ordered else Counter(permuted)) == target:
            return True
    return False


def execution_match(
    query: str,
    gold: str,
    db_path: str | Path,
    *,
    ordered: bool | None = None,
    timeout: float = TIMEOUT_SECONDS,
    max_rows: int = MAX_ROWS,
) -> SQLScore:
    """1.0 when ``query`` returns what ``gold`` returns on the database, else 0.0; with a message.

    ``ordered`` None: read from the gold query (:func:`order_matters`). The gold query runs under
    the same guard; a gold query that fails is the task's fault and says so in the message.
    """
    expected = run_query(db_path, gold, timeout=timeout, max_rows=max_rows)
    if expected.rows is None:
        return SQLScore(0.0, f"the gold query failed ({expected.error}): the task is broken")
    result = run_query(db_path, query, timeout=timeout, max_rows=max_rows)
    if result.rows is None:
        return SQLScore(0.0, f"the query failed: {result.error}")
    if ordered is None:
        ordered = order_matters(gold)
    if results_match(result.rows, expected.rows, ordered=ordered):
        return SQLScore(1.0, "match")
    same_rows = ordered and results_match(result.rows, expected.rows, ordered=False)
    detail = (
        "the rows are right but their order is not"
        if same_rows
        else f"different result: {len(result.rows)} row(s), expected {len(expected.rows)}"
    )
    return SQLScore(0.0, detail)
