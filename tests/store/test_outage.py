"""PatientStore: a store whose calls wait out outages (retry with capped backoff and jitter, log
the outage once and its end once) and raise at once every error a retry cannot fix."""

from __future__ import annotations

import logging
import threading

import pytest

from agentgrad.errors import InvalidInputError, NotFoundError
from agentgrad.store.client import StoreUnavailableError
from agentgrad.store.memory import MemoryStore
from agentgrad.store.outage import Backoff, PatientStore, is_outage
from agentgrad.store.protocol import Store


class Flaky:
    """Fails its first ``failures`` calls with ``error``, then answers ``"ok"``."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self, *args: object) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


UNREACHABLE = StoreUnavailableError(
    "store service http://127.0.0.1:9 failed 6 time(s) on POST /v1/rollouts/dequeue: "
    "ConnectionRefusedError: [Errno 111] Connection refused"
)


@pytest.fixture
def patient():
    store = PatientStore(MemoryStore(watchdog_interval=None), who="runner r1", first_delay=0.001, max_delay=0.004)
    yield store
    store.close()


def test_what_counts_as_an_outage():
    assert is_outage(UNREACHABLE) and is_outage(ConnectionResetError()) and is_outage(TimeoutError())
    assert not is_outage(InvalidInputError("bad")) and not is_outage(NotFoundError("rollout", "x"))
    assert not is_outage(FileNotFoundError())  # an OSError, but not the store being away


def test_backoff_doubles_with_jitter_up_to_its_cap():
    backoff = Backoff(first=1.0, cap=8.0)
    delays = [backoff.next() for _ in range(8)]
    nominal = [1, 2, 4, 8, 8, 8, 8, 8]
    for delay, expected in zip(delays, nominal, strict=True):
        assert expected * 0.5 <= delay <= min(8.0, expected * 1.5)
    assert len(set(delays)) > 1, "jitter: the delays are not all equal"
    backoff.reset()
    assert backoff.next() <= 1.5
    with pytest.raises(ValueError):
        Backoff(first=2.0, cap=1.0)


def test_an_outage_is_waited_out_and_logged_once_each_way(patient, caplog):
    flaky = Flaky(5, UNREACHABLE)
    with caplog.at_level(logging.INFO, logger="agentgrad.store.outage"):
        assert patient.call(flaky, "x") == "ok"
        assert patient.call(flaky, "y") == "ok"  # the store answers: nothing more to say
    assert flaky.calls == 7
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len(records) == 2, records
    (level, began), (level_end, ended) = records
    assert level == "WARNING" and "runner r1: the store cannot be reached" in began and "Connection refused" in began
    assert level_end == "INFO" and "runner r1: the store answers again after" in ended
    assert patient.outage.outages == 1 and not patient.outage.down


@pytest.mark.parametrize(
    "error", [InvalidInputError("limit must be ≥ 1"), NotFoundError("rollout", "ro-x"), ValueError("a bug")]
)
def test_errors_a_retry_cannot_fix_are_raised_at_once(patient, error):
    flaky = Flaky(1, error)
    with pytest.raises(type(error)):
        patient.call(flaky)
    assert flaky.calls == 1 and not patient.outage.down


def test_give_up_ends_the_wait_with_the_outage_error(patient):
    flaky = Flaky(10**9, UNREACHABLE)
    tries = iter(range(3))
    with pytest.raises(StoreUnavailableError):
        patient.call(flaky, give_up=lambda: next(tries) >= 2)
    assert flaky.calls == 3 and patient.outage.down


def test_try_once_skips_during_an_outage(patient):
    assert patient.try_once(Flaky(1, UNREACHABLE)) is None
    assert patient.outage.down
    assert patient.try_once(Flaky(0, UNREACHABLE)) == "ok"
    assert not patient.outage.down
    with pytest.raises(InvalidInputError):
        patient.try_once(Flaky(1, InvalidInputError("bad")))


def test_it_is_a_store_with_every_method_patient(patient):
    assert isinstance(patient, Store) and not Store.__abstractmethods__ & set(type(patient).__abstractmethods__)
    rollout = patient.enqueue_rollout({"x": 1})
    claimed = patient.dequeue_rollout(worker_id="w")
    assert claimed.rollout.rollout_id == rollout.rollout_id and patient.get_latest_attempt(rollout.rollout_id)
    assert patient.shared_url is None
    unplugged = threading.Event()
    inner = patient.inner
    real = inner.get_rollout

    def get_rollout(rollout_id: str):
        if not unplugged.is_set():
            unplugged.set()
            raise UNREACHABLE
        return real(rollout_id)

    inner.get_rollout = get_rollout  # type: ignore[method-assign]
    assert patient.get_rollout(rollout.rollout_id).rollout_id == rollout.rollout_id
    assert unplugged.is_set()
