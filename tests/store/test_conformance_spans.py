"""Conformance: spans (sequence ids, idempotency, queries) and the rollout fields spans drive."""

from __future__ import annotations

import pytest

from agentgrad import semconv
from agentgrad.errors import AgentGradError, InvalidInputError, NotFoundError
from agentgrad.types import RolloutConfig, Span, SpanEvent, SpanStatus


def test_sequence_ids_start_at_one_and_increase(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    stored = [store.add_span(kit.span(rid, aid, f"s{i}")) for i in range(3)]
    assert [s.sequence_id for s in stored] == [1, 2, 3]
    assert [s.name for s in stored] == ["s0", "s1", "s2"]


def test_sequence_ids_are_per_rollout(store, kit):
    a = kit.start(store)
    b = kit.start(store)
    seqs = {"a": [], "b": []}
    for _ in range(3):
        for key, run in (("a", a), ("b", b)):
            span = store.add_span(kit.span(run.rollout.rollout_id, run.attempt.attempt_id))
            seqs[key].append(span.sequence_id)
    assert seqs == {"a": [1, 2, 3], "b": [1, 2, 3]}


def test_sequence_ids_continue_across_attempts(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, first = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([kit.span(rid, first), kit.span(rid, first)])
    store.update_attempt(rid, first, "failed")
    second = store.dequeue_rollout().attempt.attempt_id
    span = store.add_span(kit.span(rid, second))
    assert span.sequence_id == 3


def test_add_span_is_idempotent(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    original = kit.span(rid, aid, "call", span_id="span-1", attributes={"v": 1})
    first = store.add_span(original)
    assert first.sequence_id == 1
    repeat = store.add_span(original.model_copy(update={"attributes": {"v": 2}, "name": "changed"}))
    assert repeat.sequence_id == 1
    assert repeat.attributes == {"v": 1}, "a repeat returns the stored copy"
    assert repeat.name == "call"
    spans = store.query_spans(rid)
    assert len(spans) == 1
    assert spans[0].attributes == {"v": 1}
    # The repeat consumed no sequence id.
    assert store.add_span(kit.span(rid, aid)).sequence_id == 2


def test_repeat_inside_one_batch_is_stored_once(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    span = kit.span(rid, aid, span_id="dup")
    stored = store.add_spans([span, kit.span(rid, aid, span_id="other"), span])
    assert [s.sequence_id for s in stored] == [1, 2, 1]
    assert [s.span_id for s in store.query_spans(rid)] == ["dup", "other"]


def test_same_span_id_in_another_attempt_is_another_span(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, first = started.rollout.rollout_id, started.attempt.attempt_id
    a = store.add_span(kit.span(rid, first, span_id="same"))
    store.update_attempt(rid, first, "failed")
    second = store.dequeue_rollout().attempt.attempt_id
    b = store.add_span(kit.span(rid, second, span_id="same"))
    assert (a.sequence_id, b.sequence_id) == (1, 2)
    spans = store.query_spans(rid)
    assert [(s.attempt_id, s.span_id) for s in spans] == [(first, "same"), (second, "same")]


def test_same_span_id_in_another_rollout_is_another_span(store, kit):
    a = kit.start(store)
    b = kit.start(store)
    store.add_span(kit.span(a.rollout.rollout_id, a.attempt.attempt_id, "in-a", span_id="x"))
    stored = store.add_span(kit.span(b.rollout.rollout_id, b.attempt.attempt_id, "in-b", span_id="x"))
    assert stored.name == "in-b" and stored.sequence_id == 1
    assert [s.name for s in store.query_spans(a.rollout.rollout_id)] == ["in-a"]
    assert [s.name for s in store.query_spans(b.rollout.rollout_id)] == ["in-b"]


def test_add_spans_batch(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    batch = [kit.span(rid, aid, f"n{i}") for i in range(10)]
    stored = store.add_spans(batch)
    assert [s.sequence_id for s in stored] == list(range(1, 11))
    assert [s.span_id for s in stored] == [s.span_id for s in batch]
    assert [s.span_id for s in store.query_spans(rid)] == [s.span_id for s in batch]


def test_add_spans_across_rollouts_in_one_batch(store, kit):
    a = kit.start(store)
    b = kit.start(store)
    ra, aa = a.rollout.rollout_id, a.attempt.attempt_id
    rb, ab = b.rollout.rollout_id, b.attempt.attempt_id
    stored = store.add_spans([kit.span(ra, aa), kit.span(rb, ab), kit.span(ra, aa)])
    assert [(s.rollout_id, s.sequence_id) for s in stored] == [(ra, 1), (rb, 1), (ra, 2)]


def test_add_spans_empty_batch(store):
    assert store.add_spans([]) == []


def test_span_fields_round_trip(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    attributes = {
        "str": "héllo ✓",
        "int": 7,
        "float": 0.125,
        "bool": False,
        "none": None,
        "list": [1, "two", [3.5]],
        "nested": {"a": {"b": {"c": [1, {"d": "e"}]}}},
        semconv.LLM_PROMPT_TOKEN_IDS: [101, 2023, 102],
    }
    span = Span(
        rollout_id=rid,
        attempt_id=aid,
        span_id="abc123",
        trace_id="t" * 32,
        parent_id="parent-1",
        name="agentgrad.operation",
        start_time=1000.5,
        end_time=1001.25,
        status=SpanStatus(status_code="ERROR", description="went wrong"),
        attributes=attributes,
        events=[SpanEvent(name="ev", timestamp=1000.75, attributes={"k": [1, 2]})],
        resource={"service.name": "agent", "nested": {"x": 1}},
    )
    store.add_span(span)
    (got,) = store.query_spans(rid)
    assert got.model_dump(exclude={"sequence_id"}) == span.model_dump(exclude={"sequence_id"})
    assert got.sequence_id == 1


def test_query_spans_by_attempt_and_latest(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, first = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([kit.span(rid, first, "a1"), kit.span(rid, first, "a2")])
    store.update_attempt(rid, first, "failed")
    second = store.dequeue_rollout().attempt.attempt_id
    store.add_spans([kit.span(rid, second, "b1")])
    assert [s.name for s in store.query_spans(rid)] == ["a1", "a2", "b1"]
    assert [s.name for s in store.query_spans(rid, attempt_id=None)] == ["a1", "a2", "b1"]
    assert [s.name for s in store.query_spans(rid, attempt_id=first)] == ["a1", "a2"]
    assert [s.name for s in store.query_spans(rid, attempt_id=second)] == ["b1"]
    assert [s.name for s in store.query_spans(rid, attempt_id="latest")] == ["b1"]


def test_query_spans_by_name(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([kit.span(rid, aid, n) for n in ["x", "y", "x", "z", "x"]])
    got = store.query_spans(rid, name="x")
    assert [s.sequence_id for s in got] == [1, 3, 5]
    assert store.query_spans(rid, name="nope") == []


def test_query_spans_after_sequence_id_and_limit(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([kit.span(rid, aid, f"s{i}") for i in range(1, 11)])
    assert [s.sequence_id for s in store.query_spans(rid, after_sequence_id=7)] == [8, 9, 10]
    assert [s.sequence_id for s in store.query_spans(rid, limit=3)] == [1, 2, 3]
    assert [s.sequence_id for s in store.query_spans(rid, after_sequence_id=4, limit=2)] == [5, 6]
    assert store.query_spans(rid, after_sequence_id=10) == []
    assert store.query_spans(rid, limit=0) == []
    # Paging with after_sequence_id visits every span exactly once.
    seen, cursor = [], 0
    while page := store.query_spans(rid, after_sequence_id=cursor, limit=4):
        seen.extend(s.sequence_id for s in page)
        cursor = page[-1].sequence_id
    assert seen == list(range(1, 11))


def test_query_spans_filters_combine(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([kit.span(rid, aid, n) for n in ["x", "y", "x", "x", "y", "x"]])
    got = store.query_spans(rid, attempt_id="latest", name="x", after_sequence_id=1, limit=2)
    assert [s.sequence_id for s in got] == [3, 4]


def test_query_spans_of_rollout_without_spans(store):
    rid = store.enqueue_rollout().rollout_id
    assert store.query_spans(rid) == []


def test_span_of_unknown_rollout_is_refused(store, kit):
    with pytest.raises(NotFoundError) as info:
        store.add_span(kit.span("ro-missing", "at-missing"))
    assert "ro-missing" in str(info.value)


def test_span_of_unknown_attempt_is_refused(store, kit):
    started = kit.start(store)
    rid = started.rollout.rollout_id
    with pytest.raises(NotFoundError) as info:
        store.add_span(kit.span(rid, "at-missing"))
    assert "at-missing" in str(info.value)
    assert store.query_spans(rid) == []


def test_refused_span_batch_stores_nothing(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_span(kit.span(rid, aid, "kept"))
    with pytest.raises(NotFoundError):
        store.add_spans([kit.span(rid, aid, "good"), kit.span(rid, "at-missing", "bad")])
    assert [s.name for s in store.query_spans(rid)] == ["kept"]
    assert store.add_span(kit.span(rid, aid)).sequence_id == 2


def test_span_of_queued_rollout_is_refused(store, kit):
    rid = store.enqueue_rollout().rollout_id
    with pytest.raises(NotFoundError):
        store.add_span(kit.span(rid, "at-none-yet"))


# ---- rollout fields driven by spans ----------------------------------------------------------


def _reward_span(kit, rid, aid, value):
    return kit.span(rid, aid, semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: value})


def _llm_span(kit, rid, aid, **kwargs):
    return kit.span(rid, aid, semconv.SPAN_LLM_CALL, attributes={semconv.LLM_PROMPT_TOKEN_IDS: [1, 2]}, **kwargs)


def test_reward_span_sets_rollout_reward(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    assert store.get_rollout(rid).reward is None
    store.add_span(_reward_span(kit, rid, aid, 0.75))
    assert store.get_rollout(rid).reward == pytest.approx(0.75)
    store.update_attempt(rid, aid, "succeeded")
    assert store.get_rollout(rid).reward == pytest.approx(0.75)


@pytest.mark.parametrize("phase", ["preparing", "running"])
def test_an_attempt_reported_with_its_reward_span_stores_both_at_once(store, kit, phase):
    """``update_attempt(..., spans=[reward])``: how a runner reports a success, one write."""
    claimed = kit.claim(store) if phase == "preparing" else kit.start(store)
    rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
    attempt = store.update_attempt(rid, aid, "succeeded", spans=[_reward_span(kit, rid, aid, 0.75)])
    assert attempt.status == "succeeded" and attempt.end_time is not None
    rollout = store.get_rollout(rid)
    assert rollout.status == "succeeded" and rollout.reward == pytest.approx(0.75)
    (span,) = store.query_spans(rid, aid)
    assert span.name == semconv.SPAN_REWARD and span.sequence_id == 1
    # A retry of the same report (an answer lost on the way) changes nothing.
    again = store.update_attempt(rid, aid, "succeeded", spans=[span.model_copy(update={"sequence_id": None})])
    assert again.status == "succeeded" and len(store.query_spans(rid, aid)) == 1


def test_a_refused_attempt_update_stores_none_of_its_spans(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    other = kit.start(store)
    foreign = _reward_span(kit, other.rollout.rollout_id, other.attempt.attempt_id, 1.0)
    with pytest.raises(InvalidInputError, match="not to the attempt being updated"):
        store.update_attempt(rid, aid, "succeeded", spans=[_reward_span(kit, rid, aid, 0.5), foreign])
    store.update_attempt(rid, aid, "failed")
    with pytest.raises(AgentGradError, match="cannot go from 'failed' to 'succeeded'"):
        store.update_attempt(rid, aid, "succeeded", spans=[_reward_span(kit, rid, aid, 0.5)])
    assert store.query_spans(rid, aid) == [] and store.query_spans(other.rollout.rollout_id) == []
    assert store.get_rollout(rid).reward is None and store.get_latest_attempt(rid).status == "failed"


def test_other_spans_do_not_set_reward(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_span(kit.span(rid, aid, "not.a.reward", attributes={semconv.REWARD_VALUE: 1.0}))
    assert store.get_rollout(rid).reward is None


def test_llm_calls_counts_llm_spans(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    assert store.get_rollout(rid).llm_calls == 0
    store.add_spans([_llm_span(kit, rid, aid), kit.span(rid, aid, "tool"), _llm_span(kit, rid, aid)])
    assert store.get_rollout(rid).llm_calls == 2
    store.add_span(_llm_span(kit, rid, aid))
    assert store.get_rollout(rid).llm_calls == 3


def test_repeated_llm_span_is_counted_once(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    span = _llm_span(kit, rid, aid, span_id="llm-1")
    store.add_span(span)
    store.add_span(span)
    store.add_spans([span])
    assert store.get_rollout(rid).llm_calls == 1


def test_requeue_resets_reward_and_llm_calls(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, first = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([_llm_span(kit, rid, first), _llm_span(kit, rid, first), _reward_span(kit, rid, first, 1.0)])
    assert store.get_rollout(rid).llm_calls == 2
    store.update_attempt(rid, first, "failed")
    rollout = store.get_rollout(rid)
    assert rollout.status == "requeuing"
    assert (rollout.reward, rollout.llm_calls) == (None, 0), "a requeued rollout carries no stale results"


def test_retry_counts_only_its_own_spans(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, first = started.rollout.rollout_id, started.attempt.attempt_id
    store.add_spans([_llm_span(kit, rid, first), _llm_span(kit, rid, first), _reward_span(kit, rid, first, 1.0)])
    store.update_attempt(rid, first, "failed")
    second = store.dequeue_rollout().attempt.attempt_id
    rollout = store.get_rollout(rid)
    assert (rollout.reward, rollout.llm_calls) == (None, 0)
    store.add_spans([_llm_span(kit, rid, second), _reward_span(kit, rid, second, 0.5)])
    rollout = store.get_rollout(rid)
    assert rollout.llm_calls == 1
    assert rollout.reward == pytest.approx(0.5)


def test_late_llm_span_of_old_attempt_is_not_counted(store, kit):
    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, first = started.rollout.rollout_id, started.attempt.attempt_id
    store.update_attempt(rid, first, "failed")
    second = store.dequeue_rollout().attempt.attempt_id
    store.add_span(_llm_span(kit, rid, second))
    try:
        store.add_span(_llm_span(kit, rid, first))
    except AgentGradError:
        pass  # refusing late spans is fine; counting them for the latest attempt is not
    assert store.get_rollout(rid).llm_calls == 1


# ---- what the store keeps -------------------------------------------------------------------------


def test_client_sequence_id_is_ignored(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    stored = store.add_span(kit.span(rid, aid, sequence_id=99))
    assert stored.sequence_id == 1
    assert [s.sequence_id for s in store.query_spans(rid)] == [1]


def test_stored_span_is_a_copy(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    span = kit.span(rid, aid, attributes={"list": [1]})
    returned = store.add_span(span)
    span.attributes["list"].append(2)
    returned.attributes["list"].append(3)
    assert store.query_spans(rid)[0].attributes == {"list": [1]}


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("start_time", {"start_time": float("nan")}),
        ("end_time", {"end_time": float("inf")}),
        ("events[0].timestamp", {"events": [SpanEvent(name="ev", timestamp=-float("inf"))]}),
    ],
    ids=["start-nan", "end-inf", "event-inf"],
)
def test_non_finite_span_time_is_refused(store, kit, field, fields):
    """JSON has no NaN: such a time would come back as null, or not at all, so it is refused."""
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    with pytest.raises(InvalidInputError) as info:
        store.add_spans([kit.span(rid, aid, "good"), kit.span(rid, aid, "bad", **fields)])
    assert field in str(info.value)
    assert store.query_spans(rid) == []


def test_non_json_event_attribute_is_refused(store, kit):
    started = kit.start(store)
    rid, aid = started.rollout.rollout_id, started.attempt.attempt_id
    bad = kit.span(rid, aid, "bad", events=[SpanEvent(name="ev", attributes={"blob": object()})])
    with pytest.raises(InvalidInputError) as info:
        store.add_spans([kit.span(rid, aid, "good"), bad])
    assert "blob" in str(info.value)
    assert store.query_spans(rid) == []


def test_agent_names_of_the_latest_attempts_llm_calls(store, kit):
    def call(aid: str, agent: str | None = None):
        named = {semconv.AGENT_NAME: agent} if agent else {}
        return kit.span(rid, aid, semconv.SPAN_LLM_CALL, attributes={semconv.LLM_PROMPT_TOKEN_IDS: [1], **named})

    started = kit.start(store, config=RolloutConfig(max_attempts=2, retry_on=["failed"]))
    rid, first = started.rollout.rollout_id, started.attempt.attempt_id
    tool = kit.span(rid, first, "tool", attributes={semconv.AGENT_NAME: "tool_agent"})
    store.add_spans([call(first, "writer"), tool, call(first, "checker"), call(first, "writer")])
    assert store.get_rollout(rid).agent_names == ["writer", "checker"]  # LLM calls only, first seen first
    store.update_attempt(rid, first, "failed")
    assert store.get_rollout(rid).agent_names == [], "a requeued rollout carries no stale names"
    second = store.dequeue_rollout().attempt.attempt_id
    store.add_spans([call(second, "rewriter"), call(second)])
    assert store.get_rollout(rid).agent_names == ["rewriter"]  # a call without a name adds none
