"""PostgresStore specifics: exclusive claims under real concurrency (threads and processes),
refusing foreign schemas. The Store semantics themselves are the conformance suite's job."""

from __future__ import annotations

import multiprocessing
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

psycopg = pytest.importorskip("psycopg")

from service_backends import skip_unless_ci  # noqa: E402

from agentgrad.errors import StoreFileError  # noqa: E402
from agentgrad.store.protocol import RolloutRequest  # noqa: E402

PG_URL = os.environ.get("AGENTGRAD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
N_ROLLOUTS = 1000
N_WORKERS = 8


@pytest.fixture
def schema():
    try:
        admin = psycopg.connect(PG_URL, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError:
        skip_unless_ci(f"no PostgreSQL at {PG_URL}")
    name = f"agtest_{uuid.uuid4().hex[:12]}"
    yield name
    admin.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    admin.close()


def _open(schema: str):
    from agentgrad.store.postgres import PostgresStore

    return PostgresStore(PG_URL, schema=schema, watchdog_interval=None, pool_size=2)


def _drain(schema: str, worker: str) -> list[str]:
    """Claim until the queue is empty, in batches of 1-3; returns the rollout ids claimed."""
    store = _open(schema)
    got: list[str] = []
    try:
        while claimed := store.dequeue_rollouts(1 + len(got) % 3, worker_id=worker):
            got += [c.rollout.rollout_id for c in claimed]
    finally:
        store.close()
    return got


def _fill(schema: str) -> set[str]:
    store = _open(schema)
    ids = {r.rollout_id for r in store.enqueue_rollouts([RolloutRequest(input=i) for i in range(N_ROLLOUTS)])}
    store.close()
    return ids


def _check(schema: str, expected: set[str], per_worker: list[list[str]]) -> None:
    claimed = [rid for got in per_worker for rid in got]
    assert len(claimed) == len(set(claimed)), "a rollout was handed out twice"
    assert set(claimed) == expected
    store = _open(schema)
    assert all(len(store.get_attempts(rid)) == 1 for rid in list(expected)[:50])
    assert store.count_rollouts() == N_ROLLOUTS
    store.close()


def test_eight_threads_each_with_own_store_claim_each_rollout_once(schema):
    expected = _fill(schema)
    with ThreadPoolExecutor(N_WORKERS) as pool:
        per_worker = list(pool.map(lambda i: _drain(schema, f"t{i}"), range(N_WORKERS)))
    _check(schema, expected, per_worker)


def test_eight_processes_claim_each_rollout_once(schema):
    expected = _fill(schema)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(N_WORKERS) as pool:
        per_worker = pool.starmap(_drain, [(schema, f"p{i}") for i in range(N_WORKERS)])
    _check(schema, expected, per_worker)


def test_schema_of_something_else_is_refused_untouched(schema):
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".customers (id int)')
    with pytest.raises(StoreFileError) as info:
        _open(schema)
    assert "customers" in str(info.value)
    with psycopg.connect(PG_URL) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    assert tables == [("customers",)]


def test_concurrent_openers_create_the_schema_once(schema):
    with ThreadPoolExecutor(4) as pool:
        stores = list(pool.map(lambda _: _open(schema), range(4)))
    stores[0].enqueue_rollout("x")
    assert all(s.count_rollouts() == 1 for s in stores)
    for s in stores:
        s.close()


def test_schema_travels_in_the_shared_url(schema):
    """Runner processes open the store by its shared URL: they must land in the same schema."""
    from agentgrad.store import open_store

    store = _open(schema)
    rollout = store.enqueue_rollout("x")
    url = store.shared_url
    assert f"schema={schema}" in url and PG_URL in url
    with open_store(url, watchdog=False) as reopened:
        assert reopened.schema == schema
        assert reopened.get_rollout(rollout.rollout_id).input == "x"
    with open_store(PG_URL + "?connect_timeout=5&schema=" + schema, watchdog=False) as with_options:
        assert with_options.url == PG_URL + "?connect_timeout=5" and with_options.count_rollouts() == 1
    with pytest.raises(ValueError, match="name one"):
        open_store(url, schema="other")
    store.close()


def test_password_is_not_shown_in_errors():
    from agentgrad.store.postgres import PostgresStore

    with pytest.raises(StoreFileError) as info:
        PostgresStore("postgresql://u:hunter2@127.0.0.1:1/db", connect_timeout=1)
    assert "hunter2" not in str(info.value) and "u:***@" in str(info.value)
