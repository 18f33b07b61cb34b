"""Execution match, the SQL world's reward: right and wrong answers written by hand, the tricky
cases of comparing results (row order, duplicates, NULLs, column order, floats) and queries that
must score 0 with a reason instead of raising or hanging (errors, writes, endless and huge ones)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentgrad.scenarios.sql.reward import MAX_ROWS, execution_match, order_matters, results_match, run_query


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "shop.sqlite"
    connection = sqlite3.connect(path)
    connection.executescript("""
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, age INTEGER);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), total INTEGER);
        INSERT INTO customers VALUES (1, 'Ada', 'Oslo', 30), (2, 'Ben', 'Riga', NULL), (3, 'Cara', 'Oslo', 41),
                                     (4, 'Dan', NULL, 25);
        INSERT INTO orders VALUES (1, 1, 10), (2, 1, 5), (3, 3, 7), (4, 2, 7);
    """)
    connection.commit()
    connection.close()
    return path


def score(db: Path, query: str, gold: str) -> tuple[float, str]:
    result = execution_match(query, gold, db)
    return result.reward, result.message


@pytest.mark.parametrize(
    ("query", "gold"),
    [
        ("SELECT count(id) FROM customers", "SELECT count(*) FROM customers"),
        ("select NAME from CUSTOMERS where city='Oslo'", "SELECT name FROM customers WHERE city = 'Oslo'"),
        (
            "SELECT c.name FROM customers c WHERE c.id IN (SELECT customer_id FROM orders WHERE total = 7)",
            "SELECT T2.name FROM orders AS T1 JOIN customers AS T2 ON T1.customer_id = T2.id WHERE T1.total = 7",
        ),
        (
            "SELECT name FROM customers WHERE city = 'Oslo' ORDER BY age DESC",  # order where none is asked: fine
            "SELECT name FROM customers WHERE city = 'Oslo'",
        ),
        ("SELECT total, customer_id FROM orders", "SELECT customer_id, total FROM orders"),  # columns swapped
        ("SELECT sum(age) * 1.0 / count(age) FROM customers", "SELECT avg(age) FROM customers"),  # float bits
        (
            "SELECT name FROM customers ORDER BY age DESC LIMIT 2",
            "SELECT name FROM customers ORDER BY age DESC LIMIT 2",
        ),
    ],
)
def test_right_answers_score_one(db: Path, query: str, gold: str) -> None:
    assert score(db, query, gold) == (1.0, "match")


@pytest.mark.parametrize(
    ("query", "gold", "why"),
    [
        ("SELECT name FROM customers", "SELECT name FROM customers WHERE city = 'Oslo'", "4 row(s), expected 2"),
        (
            "SELECT name, city FROM customers WHERE city = 'Oslo'",
            "SELECT name FROM customers WHERE city = 'Oslo'",
            "different result",
        ),
        ("SELECT max(age) FROM customers", "SELECT min(age) FROM customers", "different result"),
        (
            "SELECT name FROM customers ORDER BY age ASC",
            "SELECT name FROM customers ORDER BY age DESC",
            "the rows are right but their order is not",
        ),
        ("SELECT city FROM customers", "SELECT DISTINCT city FROM customers", "4 row(s), expected 3"),  # duplicates
        ("SELECT DISTINCT total FROM orders", "SELECT total FROM orders", "3 row(s), expected 4"),
        ("SELECT coalesce(age, 0) FROM customers", "SELECT age FROM customers", "different result"),  # NULL is not 0
    ],
)
def test_wrong_answers_score_zero_and_say_how(db: Path, query: str, gold: str, why: str) -> None:
    reward, message = score(db, query, gold)
    assert reward == 0.0 and why in message, message


def test_multisets_count_duplicates_and_nulls() -> None:
    assert results_match([(1,), (2,), (1,)], [(1,), (1,), (2,)], ordered=False)
    assert not results_match([(1,), (2,), (2,)], [(1,), (1,), (2,)], ordered=False)  # same set, other counts
    assert not results_match([(1,), (2,)], [(2,), (1,)], ordered=True)
    assert results_match([(None, "a"), (3, None)], [(3, None), (None, "a")], ordered=False)
    assert not results_match([(None,)], [(0,)], ordered=False) and not results_match([("1",)], [(1,)], ordered=False)
    assert results_match([(1,)], [(1.0,)], ordered=False) and results_match([(2, 1.0)], [(2.0, 1)], ordered=False)
    assert results_match([], [], ordered=False) and not results_match([(1,)], [], ordered=False)
    # column order may differ, but the same permutation must hold for every row
    assert results_match([("x", 1), ("y", 2)], [(1, "x"), (2, "y")], ordered=True)
    assert not results_match([(1, 2), (4, 3)], [(1, 2), (3, 4)], ordered=False)


def test_order_matters_only_for_the_outermost_order_by() -> None:
    assert order_matters("SELECT name FROM t ORDER BY age DESC LIMIT 3")
    assert not order_matters("SELECT name FROM t WHERE id IN (SELECT id FROM t ORDER BY age LIMIT 2)")
    assert not order_matters("SELECT 'order by' FROM t")  # words in a string are not a clause
    assert order_matters("SELEC name FRM t ORDER BY x (((")  # unparsable: the reference's text test


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("SELECT nme FROM customers", "no such column: nme"),
        ("SELEC name FROM customers", "syntax error"),
        ("", "empty query"),
        ("   ", "empty query"),
        ("SELECT 1; SELECT 2", "one statement at a time"),
        ("DELETE FROM customers", "readonly"),
        ("DROP TABLE orders", "readonly"),
        ("ATTACH DATABASE 'other.sqlite' AS other", "too many attached databases"),
        ("SELECT zeroblob(100000000)", "too big"),
    ],
)
def test_failing_queries_score_zero_with_the_reason(db: Path, query: str, why: str) -> None:
    before = sqlite3.connect(db).execute("SELECT count(*) FROM customers").fetchone()
    reward, message = score(db, query, "SELECT name FROM customers")
    assert reward == 0.0 and message.startswith("the query failed") and why in message, message
    assert sqlite3.connect(db).execute("SELECT count(*) FROM customers").fetchone() == before
    assert not (db.parent / "other.sqlite").exists()


@pytest.mark.timeout(30)
def test_a_query_that_never_ends_times_out(db: Path) -> None:
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    result = execution_match(endless, "SELECT 1", db, timeout=0.3)
    assert result.reward == 0.0 and "timed out after 0.3 s" in result.message
    quadratic = (
        "SELECT count(*) FROM customers a, customers b, customers c, customers d, customers e, "
        "(WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n)"
    )
    assert "timed out" in run_query(db, quadratic, timeout=0.3).error


@pytest.mark.timeout(30)
def test_a_huge_result_is_capped(db: Path) -> None:
    million = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n LIMIT 1000000) SELECT x FROM n"
    result = execution_match(million, "SELECT 1", db)
    assert result.reward == 0.0 and f"more than {MAX_ROWS} rows" in result.message
    assert run_query(db, million, max_rows=5).error == "more than 5 rows"
    assert len(run_query(db, million.replace("1000000", "50")).rows) == 50


def test_a_broken_task_or_database_says_so(db: Path, tmp_path: Path) -> None:
    reward, message = score(db, "SELECT 1", "SELECT nothing FROM nowhere")
    assert reward == 0.0 and "the gold query failed" in message and "task is broken" in message
    missing = execution_match("SELECT 1", "SELECT 1", tmp_path / "absent.sqlite")
    assert missing.reward == 0.0 and "no database at" in missing.message
    assert not (tmp_path / "absent.sqlite").exists()
    (tmp_path / "text.sqlite").write_text("not a database")
    assert "file is not a database" in run_query(tmp_path / "text.sqlite", "SELECT name FROM customers").error
