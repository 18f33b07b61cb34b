"""RedisStore specifics: URLs, clear errors, exclusive claims across processes, the lock's
takeover from a dead holder and its fencing of a late one, and what a write survives under each
persistence setting (a private redis-server killed and restarted). The Store semantics
themselves are the conformance suite's job (``-k redis``)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

redis = pytest.importorskip("redis")

from redis_backend import REDIS_URL, redis_available  # noqa: E402
from service_backends import skip_unless_ci  # noqa: E402

from agentgrad.errors import StoreFileError  # noqa: E402
from agentgrad.store import open_store  # noqa: E402
from agentgrad.store.outage import is_outage  # noqa: E402
from agentgrad.store.protocol import RolloutFilter, RolloutRequest  # noqa: E402
from agentgrad.store.redis import RedisStore, RedisStoreError, parse_url  # noqa: E402
from agentgrad.types import RolloutConfig, RolloutStatus  # noqa: E402

SRC_DIR = Path(__file__).resolve().parents[2] / "src"
N_ROLLOUTS = 600
N_WORKERS = 6


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def prefix() -> Iterator[str]:
    """A key prefix of this test's own, whose keys are deleted afterwards."""
    if not redis_available():
        skip_unless_ci(f"no Redis at {REDIS_URL}")
    name = f"agtest-{uuid.uuid4().hex[:12]}"
    yield name
    with redis.Redis.from_url(REDIS_URL) as client:
        for key in client.scan_iter(f"{name}:*"):
            client.delete(key)


def _open(prefix: str, **options) -> RedisStore:
    return RedisStore(REDIS_URL, prefix=prefix, watchdog_interval=None, **options)


# ---- URLs and clear errors --------------------------------------------------------------------


def test_url_prefix_and_database_are_read():
    assert parse_url("redis://h:6379/2?prefix=run7") == ("redis://h:6379/2", "run7")
    assert parse_url("rediss://u:pw@h:6380/0?socket_timeout=3&prefix=a.b-c") == (
        "rediss://u:pw@h:6380/0?socket_timeout=3",
        "a.b-c",
    )
    assert parse_url("redis://h") == ("redis://h", None)


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis://h:notaport/0", "port"),
        ("redis://h:6379/zero", "database 'zero' is not a number"),
        ("redis://:6379/0", "names no host"),
        ("redis://h:6379/0?prefix=has space", "letters, digits"),
        ("redis://h:6379/0?prefix=", "letters, digits"),
        ("redis://h:6379/0?pool=3", "unknown parameter(s) pool"),
        ("redis://h:6379/0?protocol=3", "unknown parameter(s) protocol"),
        ("http://h:6379/0", "not a Redis URL"),
    ],
)
def test_bad_urls_are_refused_naming_the_problem(url, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        parse_url(url)


def test_open_store_refuses_a_bad_redis_url_before_connecting():
    with pytest.raises(ValueError, match="port"):
        open_store("redis://127.0.0.1:99999/0")


def test_connection_refused_is_a_clear_outage_without_the_password():
    port = _free_port()  # nothing listens there
    with pytest.raises(RedisStoreError) as caught:
        RedisStore(f"redis://:s3cret@127.0.0.1:{port}/0", connect_timeout=2)
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "cannot reach Redis" in message and "refused" in message
    assert "s3cret" not in message
    assert is_outage(caught.value), "a PatientStore must wait a Redis outage out"


def test_open_store_dispatches_and_shared_url_reopens_the_same_data(prefix):
    store = open_store(f"{REDIS_URL}?prefix={prefix}", watchdog=False)
    assert isinstance(store, RedisStore) and store.prefix == prefix
    rid = store.enqueue_rollout({"x": 1}).rollout_id
    other = open_store(store.shared_url, watchdog=False)
    assert other.get_rollout(rid).input == {"x": 1}
    store.close()
    other.close()


def test_prefix_named_twice_differently_is_refused():
    with pytest.raises(ValueError, match="name one"):
        RedisStore("redis://127.0.0.1:6379/0?prefix=a", prefix="b")


def test_prefixes_keep_stores_apart(prefix):
    first = _open(prefix)
    second = _open(prefix + "-other")
    try:
        first.enqueue_rollout("mine")
        assert second.query_rollouts() == [] and second.dequeue_rollout() is None
        assert first.count_rollouts() == 1
    finally:
        second.drop()
        first.close()
        second.close()


def test_a_prefix_of_another_schema_version_is_refused(prefix):
    _open(prefix).close()
    with redis.Redis.from_url(REDIS_URL) as client:
        client.hset(f"{prefix}:meta", "schema_version", "0")
    with pytest.raises(StoreFileError, match="schema version 0"):
        _open(prefix)


def test_unfiltered_pages_come_from_the_enqueue_index_in_the_order_of_a_full_scan(prefix):
    """Pages of the unfiltered list read the enqueue-time index, not every rollout; they must be
    exactly the pages the full scan gives (ties within a batch broken by rollout id)."""
    store = _open(prefix)
    for batch in (["b3", "a9", "c1"], ["z0", "m5"], ["k2"]):
        store.enqueue_rollouts([RolloutRequest(input=rid, rollout_id=rid) for rid in batch])
    every_status = list(RolloutStatus)
    for descending in (False, True):
        for offset, limit in ((0, None), (0, 0), (0, 2), (1, 3), (4, 10), (9, 2), (2, None)):
            indexed = RolloutFilter(descending=descending, offset=offset, limit=limit)
            scanned = indexed.model_copy(update={"status": every_status})
            assert [r.rollout_id for r in store.query_rollouts(indexed)] == [
                r.rollout_id for r in store.query_rollouts(scanned)
            ], (descending, offset, limit)
    assert store.count_rollouts() == store.count_rollouts(RolloutFilter(status=every_status)) == 6
    store.close()


# ---- exclusive claims across processes -----------------------------------------------------


def _drain(prefix: str, worker: str, start: Any) -> list[str]:
    store = _open(prefix)
    got: list[str] = []
    try:
        start.wait(60)  # all together: on a loaded machine the first process up once drained the queue alone
        while claimed := store.dequeue_rollouts(1 + len(got) % 3, worker_id=worker):
            got += [c.rollout.rollout_id for c in claimed]
    finally:
        store.close()
    return got


def test_processes_claim_each_rollout_exactly_once(prefix):
    store = _open(prefix)
    expected = {r.rollout_id for r in store.enqueue_rollouts([RolloutRequest(input=i) for i in range(N_ROLLOUTS)])}
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(N_WORKERS) as pool:
        start = manager.Barrier(N_WORKERS)
        per_worker = pool.starmap(_drain, [(prefix, f"p{i}", start) for i in range(N_WORKERS)])
    claimed = [rid for got in per_worker for rid in got]
    assert len(claimed) == len(set(claimed)), "a rollout was handed out twice"
    assert set(claimed) == expected
    assert sum(1 for got in per_worker if got) > 1, "one process claimed everything: no contention was tested"
    assert all(len(store.get_attempts(rid)) == 1 for rid in list(expected)[:50])
    store.close()


def test_a_trainer_runs_its_runner_processes_over_redis(prefix):
    """The distributed shape: runner processes open the store by its ``shared_url``."""
    import io

    import agents_for_tests
    from rich.console import Console

    from agentgrad.trainer import Trainer

    store = _open(prefix)
    trainer = Trainer(
        store,
        n_runners=2,
        runner_options={"poll_timeout": 0.05, "heartbeat_interval": 0.2},
        console=Console(file=io.StringIO(), width=120),
    )
    report = trainer.dev(agents_for_tests.reward_agent, [{"x": x} for x in range(8)], timeout=120)
    assert report.total == report.succeeded == 8
    assert report.reward_mean == pytest.approx(sum(range(8)) / 80)
    pids = {
        s.attributes["pid"] for r in report.rollouts for s in store.query_spans(r.rollout_id, name="agentgrad.message")
    }
    assert os.getpid() not in pids, "the rollouts ran in the runner processes"
    store.close()


# ---- the lock: takeover from a dead holder, fencing of a late one ----------------------------

HOLDER = """
import sys, time
from agentgrad.store.redis import RedisStore

stall = False
def clock():
    if stall:
        time.sleep(3600)  # inside the heartbeat's transaction: the lock stays taken
    return time.time()

store = RedisStore({url!r}, prefix={prefix!r}, watchdog_interval=None, lock_seconds=600, clock=clock)
claimed = store.dequeue_rollout()
stall = True
print("STALLING", flush=True)
store.heartbeat(claimed.rollout.rollout_id, claimed.attempt.attempt_id)
"""


@pytest.mark.timeout(120)
def test_a_dead_holders_lock_is_taken_over_at_once(prefix, tmp_path):
    """A process killed inside a write leaves the lock taken for ``lock_seconds`` (600 here);
    the next writer finds none of the holder's connections alive and takes it over, and the
    killed call's buffered writes never reached the server."""
    store = _open(prefix)
    rid = store.enqueue_rollout("held").rollout_id
    script = tmp_path / "holder.py"
    script.write_text(textwrap.dedent(HOLDER.format(url=REDIS_URL, prefix=prefix)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "STALLING"
        with redis.Redis.from_url(REDIS_URL) as client:
            deadline = time.monotonic() + 60
            while client.get(f"{prefix}:lock") is None:
                assert time.monotonic() < deadline, "the holder never took the lock"
                time.sleep(0.01)
            assert client.pttl(f"{prefix}:lock") > 500_000
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        child.stdout.close()
    attempt = store.get_latest_attempt(rid)
    beat_before = attempt.last_heartbeat_time
    store.enqueue_rollout("after the holder died")  # would wait 600 s without the takeover
    assert store.count_rollouts() == 2
    assert store.get_latest_attempt(rid).last_heartbeat_time == beat_before, "a killed call wrote something"
    store.close()


def test_a_holder_whose_lock_expired_writes_nothing(prefix):
    """A writer stalled past ``lock_seconds`` loses the lock to another; its commit then fails
    whole (``WATCH`` on the lock) instead of overwriting what the new holder wrote."""
    stalled, resume = threading.Event(), threading.Event()
    stall = threading.Event()

    def clock() -> float:
        if stall.is_set():
            stall.clear()
            stalled.set()  # called inside the heartbeat's transaction: the lock is held
            resume.wait(30)
        return time.time()

    slow = _open(prefix, lock_seconds=0.3, clock=clock)
    other = _open(prefix)
    slow.enqueue_rollout("stalled")
    claimed = slow.dequeue_rollout()
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    slow.update_attempt(rid, aid, "running")
    errors: list[BaseException] = []

    def late_heartbeat() -> None:
        try:
            slow.heartbeat(rid, aid)
        except BaseException as exc:
            errors.append(exc)

    stall.set()
    thread = threading.Thread(target=late_heartbeat)
    thread.start()
    assert stalled.wait(30)
    other.update_attempt(rid, aid, "succeeded")  # waits for the stalled lock to expire
    resume.set()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], RedisStoreError), errors
    assert "expired" in str(errors[0])
    attempt = other.get_latest_attempt(rid)
    assert attempt.status == "succeeded"
    assert other.get_rollout(rid).status == "succeeded"
    slow.update_attempt(rid, aid, "succeeded")  # the slow store works again: same status, no change
    slow.close()
    other.close()


# ---- durability: what an acknowledged write survives ------------------------------------------


class _Server:
    """A private redis-server on a free port, with its data in ``directory``."""

    def __init__(self, directory: Path, *settings: str) -> None:
        self.directory, self.settings = directory, settings
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                *self.settings,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=1) as client:
                    if client.ping():
                        return
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def private_server(tmp_path) -> Iterator[type[_Server]]:
    if shutil.which("redis-server") is None:
        skip_unless_ci("no redis-server binary to start a private server")
    servers: list[_Server] = []

    def make(*settings: str) -> _Server:
        server = _Server(tmp_path, *settings)
        servers.append(server)
        return server

    yield make  # type: ignore[misc]
    for server in servers:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


def _write_and_crash(server: _Server, n: int = 50) -> list[str]:
    """Acknowledged writes, then the server killed (SIGKILL) and started again."""
    server.start()
    store = RedisStore(server.url, watchdog_interval=None)
    ids = [store.enqueue_rollout({"i": i}, config=RolloutConfig(max_attempts=2)).rollout_id for i in range(n)]
    claimed = store.dequeue_rollout("w")
    store.update_attempt(claimed.rollout.rollout_id, claimed.attempt.attempt_id, "succeeded")
    store.close()
    server.kill()
    server.start()
    return ids


def test_with_appendfsync_always_every_acknowledged_write_survives_a_server_crash(private_server):
    server = private_server("--appendonly", "yes", "--appendfsync", "always")
    ids = _write_and_crash(server)
    store = RedisStore(server.url, watchdog_interval=None)
    assert [r.rollout_id for r in store.query_rollouts()] == ids
    assert store.get_rollout(ids[0]).status == "succeeded"
    assert store.dequeue_rollout().rollout.rollout_id == ids[1], "the queue survived in order"
    store.close()


def test_without_persistence_a_server_crash_loses_the_store_and_opening_says_so(private_server, caplog):
    server = private_server("--appendonly", "no")
    with caplog.at_level(logging.WARNING, logger="agentgrad.store.redis"):
        _write_and_crash(server)
    assert any(
        "persists nothing" in record.getMessage() and str(server.port) in record.getMessage()
        for record in caplog.records
    )
    store = RedisStore(server.url, watchdog_interval=None)
    assert store.query_rollouts() == [], "no persistence: the restart emptied the store"
    store.close()


def test_no_warning_when_the_server_keeps_an_append_only_file(private_server, caplog):
    server = private_server("--appendonly", "yes", "--appendfsync", "everysec")
    server.start()
    with caplog.at_level(logging.WARNING, logger="agentgrad.store.redis"):
        RedisStore(server.url, watchdog_interval=None).close()
    assert not [r for r in caplog.records if "persists nothing" in r.getMessage()]
