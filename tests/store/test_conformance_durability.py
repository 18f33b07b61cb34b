"""Conformance: durable backends keep everything they acknowledged (close/reopen, SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from store_contents import store_contents

from agentgrad import semconv
from agentgrad.types import LLM, AttemptError, MetricRecord, PromptTemplate, RolloutConfig, Worker

SRC_DIR = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture
def durable(backend):
    backend.require("durable")
    return backend


def _populate(store, kit):
    store.add_resources({"llm": LLM(endpoint="http://e/v1", model="m"), "prompt": PromptTemplate(template="{x}")})
    store.add_resources({"temperature": 0.3}, resources_id="res-2")
    done = kit.start(store, {"task": "done"}, metadata={"group_id": "g"}, resources_id="res-2")
    rid, aid = done.rollout.rollout_id, done.attempt.attempt_id
    store.add_spans(
        [
            kit.span(rid, aid, semconv.SPAN_LLM_CALL, attributes={semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3]}),
            kit.span(rid, aid, semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: 0.5}),
        ]
    )
    store.update_attempt(rid, aid, "succeeded")
    retried = kit.start(store, "retry", config=RolloutConfig(max_attempts=3, retry_on=["failed"]))
    store.update_attempt(
        retried.rollout.rollout_id,
        retried.attempt.attempt_id,
        "failed",
        error=AttemptError(type="E", message="m", traceback="tb"),
    )
    cancelled = store.enqueue_rollout("cancel-me").rollout_id
    store.cancel_rollout(cancelled)
    store.enqueue_rollout({"queued": [1, 2]}, mode="val")
    store.update_rollout_metadata(rid, {"note": "kept"})
    store.update_worker(Worker(worker_id="w-1", status="busy", metadata={"pid": 1}))
    store.add_metrics(
        [
            MetricRecord(run_id="r", step=1, values={"loss": 0.5}),
            MetricRecord(run_id="r", step=2, values={"loss": 0.25}),
        ]
    )


def test_reopen_empty_store(durable):
    store = durable.new()
    store = durable.reopen(store)
    assert store.query_rollouts() == []
    assert store.get_latest_resources() is None


def test_everything_survives_reopen(durable, kit):
    store = durable.new()
    _populate(store, kit)
    before = store_contents(store)
    assert len(before["rollouts"]) == 4
    store = durable.reopen(store)
    assert store_contents(store) == before


def test_queue_survives_reopen(durable, kit):
    store = durable.new()
    config = RolloutConfig(max_attempts=2, retry_on=["failed"])
    a = store.enqueue_rollout("a", config=config).rollout_id
    b = store.enqueue_rollout("b").rollout_id
    c = store.enqueue_rollout("c").rollout_id
    claimed = store.dequeue_rollout()
    store.update_attempt(a, claimed.attempt.attempt_id, "running")
    store.update_attempt(a, claimed.attempt.attempt_id, "failed")
    claimed_b = store.dequeue_rollout()
    assert claimed_b.rollout.rollout_id == b
    store = durable.reopen(store)
    order = [x.rollout.rollout_id for x in store.dequeue_rollouts(5)]
    assert order == [c, a]
    assert store.get_latest_attempt(a).sequence_id == 2
    assert store.get_rollout(b).status == "preparing"


def test_counters_continue_after_reopen(durable, kit):
    store = durable.new()
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([kit.span(rid, aid, span_id="s1"), kit.span(rid, aid, span_id="s2")])
    store.add_resources({"n": 1})
    store = durable.reopen(store)
    assert store.add_span(kit.span(rid, aid, span_id="s1")).sequence_id == 1, "idempotency survives reopen"
    assert store.add_span(kit.span(rid, aid, span_id="s3")).sequence_id == 3
    assert store.add_resources({"n": 2}).version == 2


def test_watchdog_deadlines_survive_reopen(durable, kit):
    store = durable.new()
    started = kit.start(store, config=RolloutConfig(timeout_seconds=0.2))
    rid = started.rollout.rollout_id
    durable.close(store)
    time.sleep(0.3)
    store = durable.new()
    changed = store.check_watchdog()
    assert [a.attempt_id for a in changed] == [started.attempt.attempt_id]
    assert store.get_rollout(rid).status == "failed"


CHILD = """
import sys
{open_source}
from agentgrad.types import Span

store.enqueue_rollout("anchor", rollout_id="anchor")
claimed = store.dequeue_rollout(worker_id="child")
aid = claimed.attempt.attempt_id
print("ATTEMPT", aid, flush=True)
i = 0
while True:
    store.enqueue_rollout({{"i": i}}, rollout_id=f"kill-{{i}}")
    print("ROLLOUT", f"kill-{{i}}", i, flush=True)
    span = store.add_span(Span(rollout_id="anchor", attempt_id=aid, span_id=f"sp-{{i}}", name="w",
                               attributes={{"i": i}}))
    print("SPAN", span.span_id, span.sequence_id, flush=True)
    i += 1
"""


def test_acknowledged_writes_survive_sigkill(durable, tmp_path):
    source = CHILD.format(open_source=textwrap.dedent(durable.child_source()))
    script = tmp_path / "child.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC_DIR), os.environ.get("PYTHONPATH", "")])}
    stderr_path = tmp_path / "child.err"
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=stderr, env=env, text=True, bufsize=1
        )
    lines = []
    deadline = time.monotonic() + 30
    try:
        while sum(line.startswith("SPAN") for line in lines) < 60:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"child exited early: {stderr_path.read_text()[-2000:]}")
            lines.append(line)
            assert time.monotonic() < deadline, "child too slow"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # Whatever the child printed before it died was acknowledged by the store too.
        lines.extend(proc.stdout.read().splitlines(keepends=True))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    complete = [line.split() for line in lines if line.endswith("\n")]
    attempt_id = next(parts[1] for parts in complete if parts[0] == "ATTEMPT")
    rollouts = {parts[1]: int(parts[2]) for parts in complete if parts[0] == "ROLLOUT"}
    spans = {parts[1]: int(parts[2]) for parts in complete if parts[0] == "SPAN"}
    assert len(spans) >= 60

    store = durable.new()
    for rid, i in rollouts.items():
        assert store.get_rollout(rid).input == {"i": i}
    stored_spans = {s.span_id: s for s in store.query_spans("anchor", attempt_id=attempt_id)}
    for span_id, sequence_id in spans.items():
        assert span_id in stored_spans, f"acknowledged span {span_id} lost"
        assert stored_spans[span_id].sequence_id == sequence_id
    seqs = sorted(s.sequence_id for s in stored_spans.values())
    assert seqs == list(range(1, len(seqs) + 1))
    assert store.get_latest_attempt("anchor").worker_id == "child"
    # The store is fully usable after the crash.
    store.enqueue_rollout("after-crash")
    claimed = store.dequeue_rollout()
    assert claimed.rollout.rollout_id == "kill-0"
