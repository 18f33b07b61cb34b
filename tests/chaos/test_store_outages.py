"""Chaos: the store service SIGKILLed and brought back after an outage, with runners at work.

Real processes started by their CLI on 127.0.0.1: ``agentgrad store serve`` over an SQLite file
(restarted on the same port) and three ``agentgrad runner chaos_agents:steady`` with two rollouts
in flight each, while this process keeps enqueuing rollouts and writing metrics. Before issue 22,
finding 1, an outage longer than the client's retries (~2 s) made every runner exit and left its
attempt in flight unreported. Now: no runner process exits, each logs every outage it noticed
once and its end once, every rollout ends ``succeeded`` exactly once, and no acknowledged write
(an enqueue or a metric that this process was answered for) is lost.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from chaos_processes import RunnerProcess, StoreService

from agentgrad.store.client import StoreClient
from agentgrad.store.outage import OUTAGE_ERRORS
from agentgrad.store.protocol import RolloutFilter, RolloutRequest
from agentgrad.types import AttemptStatus, MetricRecord, RolloutConfig, RolloutStatus

pytestmark = pytest.mark.chaos

AGENT = "chaos_agents:steady"
OUTAGE_BEGINS, OUTAGE_ENDS = "the store cannot be reached", "the store answers again after"


def test_store_outages(tmp_path: Path) -> None:
    """The fast case: outages of 1 s and 3 s (longer than the client's own retries), a 10 s
    heartbeat deadline so that a claim whose answer died with the service comes back soon."""
    outages(tmp_path, [1.0, 3.0], RolloutConfig(unresponsive_seconds=10))


@pytest.mark.chaos_long
def test_store_outages_of_1_10_and_60_seconds(tmp_path: Path) -> None:
    """The issue's case: three kills, outages of 1, 10 and 60 s, the default ``RolloutConfig``."""
    outages(tmp_path, [1.0, 10.0, 60.0], None)


class Writer(threading.Thread):
    """Enqueues two rollouts and writes one metric record every 0.2 s, through every outage;
    remembers what the service acknowledged."""

    def __init__(self, url: str, config: RolloutConfig | None) -> None:
        super().__init__(daemon=True)
        self.client = StoreClient(url, retries=2, backoff=0.05, timeout=10)
        self.config = config
        self.rollouts: dict[str, int] = {}  # acknowledged: rollout id → x
        self.steps: list[int] = []  # acknowledged metric steps
        self.refused = 0  # writes that got no answer (they may or may not have been stored)
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        n = 0
        try:
            while not self._halt.wait(0.2):
                n += 1
                requests = [
                    RolloutRequest(
                        input={"x": 2 * n + i, "sleep": 0.2},
                        **({"config": self.config} if self.config is not None else {}),
                    )
                    for i in range(2)
                ]
                try:
                    for rollout in self.client.enqueue_rollouts(requests):
                        self.rollouts[rollout.rollout_id] = rollout.input["x"]
                    self.client.add_metrics([MetricRecord(run_id="chaos", step=n, values={"n": n})])
                    self.steps.append(n)
                except OUTAGE_ERRORS:
                    self.refused += 1
        except BaseException as exc:  # noqa: BLE001 - the thread's error is the test's to report
            self.error = exc

    def stop(self) -> None:
        self._halt.set()
        self.join(30)
        self.client.close()


def outages(tmp_path: Path, lengths: list[float], config: RolloutConfig | None) -> None:
    service = StoreService(tmp_path / "store.db", tmp_path / "service.log").start()
    client = StoreClient(service.url)
    runners = [RunnerProcess(AGENT, service.url, f"r{i}", tmp_path, concurrency=2) for i in range(3)]
    writer = Writer(service.url, config)
    try:
        wait_until(lambda: len(client.query_workers()) == len(runners), "every runner reports for work")
        writer.start()
        for length in lengths:
            succeeded = count_succeeded(client)
            wait_until(
                lambda before=succeeded: all_alive(runners) and count_succeeded(client) >= before + 10,
                "rollouts succeed between outages",
            )
            assert service.kill() == -9
            time.sleep(length)
            service.start()
        acknowledged = len(writer.steps)
        wait_until(lambda: len(writer.steps) >= acknowledged + 5, "writes go on after the last outage")
        writer.stop()
        assert writer.error is None, writer.error

        assert all_alive(runners)
        stored = {r.rollout_id: r for r in client.query_rollouts(RolloutFilter())}
        missing = set(writer.rollouts) - set(stored)
        assert not missing, f"{len(missing)} acknowledged enqueue(s) lost"
        done = client.wait_for_rollouts(list(stored), timeout=240)
        unfinished = set(stored) - {r.rollout_id for r in done}
        assert not unfinished, (
            f"{len(unfinished)} rollout(s) never ended: {[stored[i] for i in sorted(unfinished)][:3]}"
        )
        for rollout in done:
            attempts = client.get_attempts(rollout.rollout_id)
            assert rollout.status == RolloutStatus.SUCCEEDED, (rollout, attempts)
            assert rollout.reward == rollout.input["x"]
            assert [a.status for a in attempts].count(AttemptStatus.SUCCEEDED) == 1, attempts  # not twice
        steps = [record.step for record in client.query_metrics("chaos")]
        assert sorted(set(writer.steps) - set(steps)) == [], "acknowledged metric records lost"
        assert len(steps) == len(set(steps)), "a metric record stored twice"

        for runner in runners:
            log = runner.text()
            began, ended = log.count(OUTAGE_BEGINS), log.count(OUTAGE_ENDS)
            assert began == ended, f"{runner.worker_id}: {began} outage(s) logged, {ended} end(s):\n{log[-3000:]}"
            assert 1 <= began <= len(lengths), log[-3000:]  # once per outage, however long
            assert runner.terminate() == 0, log[-3000:]
    finally:
        client.close()
        if writer.is_alive():
            writer.stop()
        for runner in runners:
            runner.kill()
        service.kill()


def all_alive(runners: list[RunnerProcess]) -> bool:
    """True, or a failure naming the runner process that exited and how."""
    for runner in runners:
        assert runner.alive(), f"runner {runner.worker_id} exited ({runner.proc.returncode}):\n{runner.text()[-3000:]}"
    return True


def count_succeeded(client: StoreClient) -> int:
    return client.count_rollouts(RolloutFilter(status=[RolloutStatus.SUCCEEDED]))


def wait_until(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)
