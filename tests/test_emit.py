"""Emitters, driven inside a real rollout context over MemoryStore and SqliteStore."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentgrad import semconv
from agentgrad.context import RolloutContext, current_context, use_context
from agentgrad.emit import agent, emit_exception, emit_message, emit_object, emit_reward, operation
from agentgrad.errors import NoRolloutContextError
from agentgrad.runner import Runner
from agentgrad.types import AttemptStatus, RolloutStatus, Span


@pytest.fixture
def ctx(local_store):
    """A claimed rollout + attempt, with the emitters' context set as a runner would."""
    local_store.enqueue_rollout({"q": 1})
    claimed = local_store.dequeue_rollout("test-worker")
    context = RolloutContext(store=local_store, rollout=claimed.rollout, attempt=claimed.attempt)
    with use_context(context):
        yield context


def spans_of(context: RolloutContext) -> list[Span]:
    return context.store.query_spans(context.rollout_id, context.attempt_id)


# ---- rewards ---------------------------------------------------------------------------------------


def test_emit_reward_scalar(ctx):
    span = emit_reward(0.5)
    assert span.name == semconv.SPAN_REWARD and span.sequence_id == 1
    assert span.attributes[semconv.REWARD_VALUE] == 0.5
    emit_reward(2)  # ints are numbers; the last one is the rollout's reward
    assert ctx.store.get_rollout(ctx.rollout_id).reward == 2.0
    # the first span moved the attempt (and rollout) from preparing to running
    assert ctx.store.get_latest_attempt(ctx.rollout_id).status == AttemptStatus.RUNNING
    assert ctx.store.get_rollout(ctx.rollout_id).status == RolloutStatus.RUNNING


def test_emit_reward_dimensions(ctx):
    span = emit_reward({"correct": 1.0, "short": 0.25}, primary="short")
    attrs = span.attributes
    assert attrs[semconv.REWARD_PREFIX + "correct"] == 1.0
    assert attrs[semconv.REWARD_PREFIX + "short"] == 0.25
    assert attrs[semconv.REWARD_PRIMARY] == "short"
    assert attrs[semconv.REWARD_VALUE] == 0.25
    assert ctx.store.get_rollout(ctx.rollout_id).reward == 0.25
    single = emit_reward({"only": 0.75})  # one dimension: primary by default
    assert single.attributes[semconv.REWARD_VALUE] == 0.75
    assert single.attributes[semconv.REWARD_PRIMARY] == "only"


@pytest.mark.parametrize(
    ("value", "primary", "error", "needle"),
    [
        ({"a": 1.0, "b": 0.0}, None, ValueError, "primary"),
        ({"a": 1.0, "b": 0.0}, "c", ValueError, "'c'"),
        ({}, None, ValueError, "no reward dimensions"),
        ({"a": "high"}, None, TypeError, "finite number"),
        ("0.5", None, TypeError, "finite number"),
        (float("nan"), None, TypeError, "finite number"),
        (True, None, TypeError, "finite number"),
        ({"value": 1.0, "b": 0.0}, "b", ValueError, "reserved"),
        ({"primary": 1.0}, None, ValueError, "reserved"),
    ],
)
def test_emit_reward_refuses_bad_values(ctx, value, primary, error, needle):
    with pytest.raises(error, match=needle):
        emit_reward(value, primary=primary)
    assert spans_of(ctx) == []  # nothing was written


# ---- messages, objects, exceptions -----------------------------------------------------------------


def test_emit_message_object_exception(ctx):
    message = emit_message("hello", step=3)
    assert message.name == semconv.SPAN_MESSAGE
    assert message.attributes[semconv.MESSAGE_BODY] == "hello" and message.attributes["step"] == 3

    obj = emit_object(ctx.rollout)  # pydantic models are dumped first
    assert obj.name == semconv.SPAN_OBJECT and obj.attributes[semconv.OBJECT_TYPE] == "Rollout"
    assert json.loads(obj.attributes[semconv.OBJECT_JSON])["rollout_id"] == ctx.rollout_id
    assert json.loads(emit_object([1, {"a": None}]).attributes[semconv.OBJECT_JSON]) == [1, {"a": None}]
    with pytest.raises(TypeError, match="JSON-serializable"):
        emit_object({1, 2})

    try:
        raise KeyError("missing")
    except KeyError as exc:
        span = emit_exception(exc, where="lookup")
    attrs = span.attributes
    assert span.name == semconv.SPAN_EXCEPTION and span.status.status_code == "ERROR"
    assert attrs[semconv.EXCEPTION_TYPE] == "KeyError" and "missing" in attrs[semconv.EXCEPTION_MESSAGE]
    assert "raise KeyError" in attrs[semconv.EXCEPTION_STACKTRACE] and attrs["where"] == "lookup"

    stored = spans_of(ctx)
    assert [s.sequence_id for s in stored] == [1, 2, 3, 4]
    assert {s.trace_id for s in stored} == {message.trace_id}  # one trace per attempt


# ---- operation -------------------------------------------------------------------------------------


@operation
def add(a, b):
    return a + b


@operation("multiply")
def mul(a, b):
    return a * b


@operation
async def slow_double(x):
    await asyncio.sleep(0)
    emit_message("inside")
    return 2 * x


class Calculator:
    @operation
    def square(self, x, name="sq"):
        return x * x

    @operation("cube")
    async def cube(self, x):
        return x**3


def test_operation_decorators(ctx):
    assert add(1, b=2) == 3
    assert mul(2, 3) == 6
    assert asyncio.run(slow_double(4)) == 8
    calc = Calculator()
    assert calc.square(5, name="five") == 25  # a method, with a parameter called `name`
    assert asyncio.run(calc.cube(2)) == 8
    ops = [s for s in spans_of(ctx) if s.name == semconv.SPAN_OPERATION]
    by_name = {s.attributes[semconv.OPERATION_NAME]: s for s in ops}
    assert set(by_name) == {"add", "multiply", "slow_double", "Calculator.square", "cube"}
    assert by_name["add"].attributes[semconv.OPERATION_INPUT] == {"a": 1, "b": 2}
    assert by_name["add"].attributes[semconv.OPERATION_OUTPUT] == 3
    assert by_name["multiply"].attributes[semconv.OPERATION_OUTPUT] == 6
    assert by_name["Calculator.square"].attributes[semconv.OPERATION_INPUT] == {"x": 5, "name": "five"}
    assert by_name["cube"].attributes[semconv.OPERATION_INPUT] == {"x": 2}
    assert by_name["cube"].attributes[semconv.OPERATION_OUTPUT] == 8
    for span in ops:
        assert span.status.status_code == "OK" and span.end_time >= span.start_time
    inside = next(s for s in spans_of(ctx) if s.name == semconv.SPAN_MESSAGE)
    assert inside.parent_id == by_name["slow_double"].span_id


def test_operation_context_manager_and_nesting(ctx):
    with operation("outer", query="q") as outer:
        with operation("inner") as inner:
            emit_reward(1.0)
            inner.set_output({"found": [1, 2]})
        outer.set_output(object())  # not JSON: kept as its repr
    spans = {
        s.name if s.name != semconv.SPAN_OPERATION else s.attributes[semconv.OPERATION_NAME]: s for s in spans_of(ctx)
    }
    assert spans["outer"].parent_id is None
    assert spans["inner"].parent_id == spans["outer"].span_id
    assert spans[semconv.SPAN_REWARD].parent_id == spans["inner"].span_id
    assert spans["outer"].attributes[semconv.OPERATION_INPUT] == {"query": "q"}
    assert spans["inner"].attributes[semconv.OPERATION_OUTPUT] == {"found": [1, 2]}
    assert spans["outer"].attributes[semconv.OPERATION_OUTPUT].startswith("<object object")
    assert spans["inner"].start_time >= spans["outer"].start_time
    assert current_context().parent_span_id is None  # scopes were left


def test_operation_records_errors(ctx):
    with pytest.raises(ZeroDivisionError):
        with operation("divide"):
            1 / 0  # noqa: B018

    @operation
    def broken():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        broken()
    failed = [s for s in spans_of(ctx) if s.name == semconv.SPAN_OPERATION]
    assert [s.status.status_code for s in failed] == ["ERROR", "ERROR"]
    assert "ZeroDivisionError" in failed[0].status.description
    assert "RuntimeError: boom" in failed[1].status.description


# ---- agent scopes ----------------------------------------------------------------------------------


def test_agent_scope_tags_spans(ctx):
    emit_message("untagged")
    with agent("planner"):
        emit_message("plan")
        with agent("critic"):
            emit_reward(0.5)
            with operation("check"):
                pass
        emit_message("plan again")
    spans = spans_of(ctx)
    names = [(s.name, s.attributes.get(semconv.MESSAGE_BODY), s.attributes.get(semconv.AGENT_NAME)) for s in spans]
    assert names == [
        (semconv.SPAN_MESSAGE, "untagged", None),
        (semconv.SPAN_MESSAGE, "plan", "planner"),
        (semconv.SPAN_REWARD, None, "critic"),
        (semconv.SPAN_OPERATION, None, "critic"),
        (semconv.SPAN_AGENT, None, "critic"),
        (semconv.SPAN_MESSAGE, "plan again", "planner"),
        (semconv.SPAN_AGENT, None, "planner"),
    ]
    by_seq = {s.sequence_id: s for s in spans}
    planner, critic = by_seq[7], by_seq[5]
    assert critic.parent_id == planner.span_id and planner.parent_id is None
    assert by_seq[2].parent_id == planner.span_id and by_seq[3].parent_id == critic.span_id
    with pytest.raises(ValueError, match="non-empty name"):
        with agent(""):
            pass


def test_agent_scope_errors_are_recorded(ctx):
    with pytest.raises(KeyError):
        with agent("worker"):
            raise KeyError("x")
    (span,) = spans_of(ctx)
    assert span.name == semconv.SPAN_AGENT and span.status.status_code == "ERROR"


# ---- outside a rollout -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("what", "call"),
    [
        ("emit_reward", lambda: emit_reward(1.0)),
        ("emit_message", lambda: emit_message("x")),
        ("emit_object", lambda: emit_object({"a": 1})),
        ("emit_exception", lambda: emit_exception(ValueError("x"))),
        ("operation", lambda: operation("x").__enter__()),
        ("operation", lambda: add(1, 2)),
    ],
)
def test_emitters_outside_a_rollout(what, call):
    assert current_context() is None
    with pytest.raises(NoRolloutContextError) as info:
        call()
    assert f"{what}() was called outside a rollout" in str(info.value)


def test_agent_scope_outside_a_rollout_is_a_no_op(caplog):
    """Agent code instrumented with agent() still runs in production, where no rollout is."""
    caplog.set_level("DEBUG", logger="agentgrad.emit")
    with agent("writer"):
        assert current_context() is None
        answer = 42
    assert answer == 42
    assert "agent('writer') outside a rollout" in caplog.text
    with pytest.raises(ValueError, match="non-empty name"):  # a bad name is still a bug
        with agent(""):
            pass
    with pytest.raises(KeyError):  # and exceptions pass through
        with agent("writer"):
            raise KeyError("x")


# ---- through a real runner -------------------------------------------------------------------------


def test_emitters_inside_a_runner(local_store):
    def agent_fn(task, resources):
        with agent("solver"):
            with operation("think") as op:
                emit_message("thinking")
                op.set_output("done")
            emit_reward({"correct": 1.0, "style": 0.5}, primary="correct")

    rollout = local_store.enqueue_rollout({"q": 2})
    Runner(agent_fn, local_store, max_rollouts=1, poll_timeout=0.05).run()
    final = local_store.get_rollout(rollout.rollout_id)
    assert final.status == RolloutStatus.SUCCEEDED and final.reward == 1.0
    spans = local_store.query_spans(rollout.rollout_id, "latest")
    assert all(s.attributes.get(semconv.AGENT_NAME) == "solver" for s in spans)
    assert len({s.trace_id for s in spans}) == 1
    think = next(s for s in spans if s.attributes.get(semconv.OPERATION_NAME) == "think")
    message = next(s for s in spans if s.name == semconv.SPAN_MESSAGE)
    assert message.parent_id == think.span_id
