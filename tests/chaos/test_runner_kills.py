"""Chaos: runner processes SIGKILLed in the middle of a rollout.

Real processes started by their CLI on 127.0.0.1: ``agentgrad store serve`` over an SQLite file
and ``agentgrad runner chaos_agents:steady``. Some tasks hang on their first attempt; each time a
runner is seen hanging in one, it is SIGKILLed by PID and a fresh runner takes its place. With the
default ``RolloutConfig`` (issue 22, finding 2: it used to have no heartbeat deadline, and a killed
runner's rollout stayed ``running`` forever) the store's watchdog ends the dead attempt
``unresponsive`` and the rollout runs again: every rollout ends ``succeeded`` exactly once, none
is lost, none is duplicated.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from chaos_processes import RunnerProcess, StoreService

from agentgrad.store.client import StoreClient
from agentgrad.store.protocol import RolloutRequest
from agentgrad.types import AttemptStatus, RolloutConfig, RolloutStatus

pytestmark = pytest.mark.chaos

AGENT = "chaos_agents:steady"


def test_runner_kills(tmp_path: Path) -> None:
    """The fast case: 2 kills over 20 rollouts, the default retry policy with a 2 s deadline."""
    kill_runners(tmp_path, rollouts=20, kills=2, runners=2, config=RolloutConfig(unresponsive_seconds=2))


@pytest.mark.chaos_long
def test_runner_kills_with_the_default_config(tmp_path: Path) -> None:
    """The issue's case: 10 kills over 100 rollouts, all with the default ``RolloutConfig``."""
    kill_runners(tmp_path, rollouts=100, kills=10, runners=4, config=None)


def kill_runners(tmp_path: Path, *, rollouts: int, kills: int, runners: int, config: RolloutConfig | None) -> None:
    service = StoreService(tmp_path / "store.db", tmp_path / "service.log").start()
    client = StoreClient(service.url)
    live: dict[str, RunnerProcess] = {}
    dead: list[RunnerProcess] = []

    def add_runner() -> None:
        worker_id = f"r{len(live) + len(dead)}"
        live[worker_id] = RunnerProcess(AGENT, service.url, worker_id, tmp_path)

    try:
        every = rollouts // kills
        requests = [
            RolloutRequest(
                input={"x": i, "sleep": 0.05, "hang": i % every == every // 2},
                **({"config": config} if config is not None else {}),
            )
            for i in range(rollouts)
        ]
        enqueued = client.enqueue_rollouts(requests)
        assert all(r.config == (config or RolloutConfig()) for r in enqueued)
        hanging = {r.rollout_id for r in enqueued if r.input["hang"]}
        for _ in range(runners):
            add_runner()

        killed: dict[str, str] = {}  # rollout id → the worker killed in its first attempt
        deadline = time.monotonic() + 180
        while len(killed) < kills:
            assert time.monotonic() < deadline, f"only {len(killed)} of {kills} kills: runner logs in {tmp_path}"
            for rollout_id in sorted(hanging - killed.keys()):
                attempt = client.get_latest_attempt(rollout_id)
                if attempt is None or attempt.sequence_id != 1 or attempt.status != AttemptStatus.RUNNING:
                    continue
                if not client.query_spans(rollout_id, attempt.attempt_id, name="agentgrad.message"):
                    continue  # claimed, but not yet in its hang
                runner = live.pop(attempt.worker_id)
                assert runner.kill() == -9
                dead.append(runner)
                killed[rollout_id] = runner.worker_id
                add_runner()
            time.sleep(0.1)

        ids = [r.rollout_id for r in enqueued]
        done = client.wait_for_rollouts(ids, timeout=240)
        unfinished = sorted(set(ids) - {r.rollout_id for r in done})
        assert not unfinished, (
            f"lost: {len(unfinished)} rollout(s) never ended, e.g. {client.get_rollout(unfinished[0])}"
        )
        for rollout in done:
            attempts = client.get_attempts(rollout.rollout_id)
            statuses = [a.status for a in attempts]
            assert rollout.status == RolloutStatus.SUCCEEDED, (rollout, attempts)
            assert rollout.reward == rollout.input["x"]
            if rollout.rollout_id in killed:
                assert statuses == [AttemptStatus.UNRESPONSIVE, AttemptStatus.SUCCEEDED], attempts
                assert attempts[0].worker_id == killed[rollout.rollout_id]
                assert attempts[1].worker_id != killed[rollout.rollout_id]
            else:
                assert statuses == [AttemptStatus.SUCCEEDED], attempts  # run once: nothing duplicated
        assert [r.alive() for r in live.values()] == [True] * runners, "a runner that was not killed exited"
        for runner in live.values():
            assert runner.terminate() == 0, runner.text()[-2000:]
    finally:
        client.close()
        for runner in [*live.values(), *dead]:
            runner.kill()
        service.kill()
