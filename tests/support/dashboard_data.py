"""Stores filled for the dashboard tests.

``fill_by_hand`` builds one by hand through the public Store API, fast and exact, for the
route tests: the LLM-call span is written the way the capture proxy writes it (token ids,
logprobs, request/response JSON), and span contents carry HTML/script payloads to prove
that everything the dashboard shows is escaped. The browser tests use a store filled by a
real run instead (``test_dashboard_browser.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentgrad import semconv
from agentgrad.store.protocol import Store
from agentgrad.types import (
    LLM,
    AttemptError,
    AttemptStatus,
    MetricRecord,
    PromptTemplate,
    RolloutConfig,
    Span,
    SpanStatus,
    Worker,
)

XSS = '<script>alert("xss")</script><img src=x onerror=alert(1)>'


@dataclass
class Filled:
    """Ids of what :func:`fill_by_hand` stored, for the assertions."""

    store: Store
    good: str  # succeeded, one LLM call, rewards, nested spans
    retried: str  # first attempt failed, second succeeded
    empty: str  # succeeded without any LLM call (flagged)
    queued: str
    v1: str
    v2: str


def fill_by_hand(store: Store) -> Filled:
    """Two resource versions, four rollouts in different states, metrics and workers."""
    v1 = store.add_resources(
        {
            "llm": LLM(endpoint="http://127.0.0.1:9/v1", model="tiny-calc", api_key="sk-secret-key"),
            "prompt": PromptTemplate(template="Solve: {question}\nAnswer with a number."),
        }
    )
    v2 = store.add_resources(
        {
            "llm": LLM(endpoint="http://127.0.0.1:9/v1", model="tiny-calc", api_key="sk-secret-key"),
            "prompt": PromptTemplate(template="Solve step by step: {question}\nAnswer with a number."),
            "notes": XSS,
        }
    )
    good = store.enqueue_rollout({"question": f"2+3 {XSS}"}, resources_id=v2.resources_id, rollout_id="ro-good")
    retried = store.enqueue_rollout({"question": "7*6"}, rollout_id="ro-retried", config=RolloutConfig(max_attempts=2))
    empty = store.enqueue_rollout({"question": "no llm"}, mode="val", rollout_id="ro-empty")

    claimed = {c.rollout.rollout_id: c for c in store.dequeue_rollouts(3, worker_id="worker-a")}
    t0 = time.time()

    # ro-good: agent scope > operation > LLM call, then a reward with two dimensions.
    attempt = claimed["ro-good"].attempt.attempt_id
    base = {"rollout_id": good.rollout_id, "attempt_id": attempt, "trace_id": "a" * 32}
    llm_span = Span(
        **base,
        span_id="llm1",
        parent_id="op1",
        name=semconv.SPAN_LLM_CALL,
        start_time=t0 + 0.1,
        end_time=t0 + 0.4,
        attributes={
            semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3, 4],
            semconv.LLM_COMPLETION_TOKEN_IDS: [10, 11, 12],
            semconv.LLM_LOGPROBS: [-0.01, -1.2, -4.0],
            semconv.LLM_REQUEST: {
                "model": "tiny-calc",
                "messages": [
                    {"role": "system", "content": "You are a calculator."},
                    {"role": "user", "content": f"What is 2+3? {XSS}"},
                ],
                "tools": [{"type": "function", "function": {"name": "calculate", "parameters": {}}}],
            },
            semconv.LLM_RESPONSE: {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {
                            "role": "assistant",
                            "content": "Let me compute.",
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "calculate", "arguments": '{"expression": "2+3"}'},
                                }
                            ],
                        },
                        "logprobs": {
                            "content": [
                                {"token": "<b>Let", "logprob": -0.01},
                                {"token": " me", "logprob": -1.2},
                                {"token": " compute", "logprob": -4.0},
                            ]
                        },
                    }
                ],
            },
            semconv.MODEL_VERSION: "v7",
            semconv.GEN_AI_REQUEST_MODEL: "tiny-calc",
            semconv.AGENT_NAME: "solver",
        },
    )
    store.add_spans(
        [
            Span(
                **base,
                span_id="agent1",
                name=semconv.SPAN_AGENT,
                start_time=t0,
                end_time=t0 + 0.6,
                attributes={semconv.AGENT_NAME: "solver"},
            ),
            Span(
                **base,
                span_id="op1",
                parent_id="agent1",
                name=semconv.SPAN_OPERATION,
                start_time=t0 + 0.05,
                end_time=t0 + 0.5,
                attributes={semconv.OPERATION_NAME: "plan", semconv.OPERATION_INPUT: {"q": XSS}},
            ),
            llm_span,
            Span(
                **base,
                span_id="msg1",
                parent_id="agent1",
                name=semconv.SPAN_MESSAGE,
                start_time=t0 + 0.45,
                end_time=t0 + 0.45,
                attributes={semconv.MESSAGE_BODY: f"model said {XSS}"},
            ),
            Span(
                **base,
                span_id="rw1",
                name=semconv.SPAN_REWARD,
                start_time=t0 + 0.7,
                end_time=t0 + 0.7,
                attributes={
                    semconv.REWARD_VALUE: 1.0,
                    semconv.REWARD_PRIMARY: "correct",
                    semconv.REWARD_PREFIX + "correct": 1.0,
                    semconv.REWARD_PREFIX + "short": 0.25,
                },
            ),
        ]
    )
    store.update_attempt(good.rollout_id, attempt, AttemptStatus.SUCCEEDED)

    # ro-retried: the first attempt fails with an error, the second succeeds with a reward.
    first = claimed["ro-retried"].attempt.attempt_id
    store.add_span(
        Span(
            rollout_id=retried.rollout_id,
            attempt_id=first,
            name=semconv.SPAN_EXCEPTION,
            status=SpanStatus(status_code="ERROR", description="boom"),
            attributes={semconv.EXCEPTION_TYPE: "ValueError", semconv.EXCEPTION_MESSAGE: "boom"},
        )
    )
    store.update_attempt(
        retried.rollout_id,
        first,
        AttemptStatus.FAILED,
        AttemptError(type="ValueError", message="boom", traceback="Traceback …\nValueError: boom"),
    )
    second = store.dequeue_rollout(worker_id="worker-b")
    assert second is not None and second.rollout.rollout_id == retried.rollout_id
    store.add_span(
        Span(
            rollout_id=retried.rollout_id,
            attempt_id=second.attempt.attempt_id,
            name=semconv.SPAN_REWARD,
            attributes={semconv.REWARD_VALUE: 0.5},
        )
    )
    store.update_attempt(retried.rollout_id, second.attempt.attempt_id, AttemptStatus.SUCCEEDED)
    queued = store.enqueue_rollout({"question": "later"}, rollout_id="ro-queued")

    # ro-empty: finishes without any LLM call, which the dashboard must flag.
    empty_attempt = claimed["ro-empty"].attempt.attempt_id
    store.add_span(
        Span(
            rollout_id=empty.rollout_id,
            attempt_id=empty_attempt,
            name=semconv.SPAN_REWARD,
            attributes={semconv.REWARD_VALUE: 0.0},
        )
    )
    store.update_attempt(empty.rollout_id, empty_attempt, AttemptStatus.SUCCEEDED)

    store.add_metrics([MetricRecord(run_id="old-run", step=0, values={"loss": 3.0})])
    store.add_metrics(
        [
            MetricRecord(
                run_id="grpo-1",
                step=step,
                values={
                    "reward/mean": 0.2 + 0.03 * step,
                    "success_rate": 0.1 + 0.04 * step,
                    "loss": 1.0 / (step + 1),
                    "kl": 0.001 * step,
                    "throughput/tokens_per_s": 900.0 + step,
                },
            )
            for step in range(12)
        ]
    )
    store.update_worker(
        Worker(worker_id="worker-a", status="busy", current_rollout_id=queued.rollout_id, metadata={"pid": 4242})
    )
    store.update_worker(Worker(worker_id="worker-silent", status="idle", last_heartbeat_time=time.time() - 3600))
    store.update_worker(Worker(worker_id=f"worker-{XSS}", status="stopped"))
    return Filled(
        store,
        good.rollout_id,
        retried.rollout_id,
        empty.rollout_id,
        queued.rollout_id,
        v1.resources_id,
        v2.resources_id,
    )
