"""A store holding what GRPO, SFT and APO runs leave behind, written through the Store API in the
shapes the algorithms write (their group ids, metadata, metric names, APO's lineage snapshots),
for the runs, rollouts, group, replay and prompts pages.

The LLM-call spans carry token ids made by the real tiny-calc tokenizer shipped with the demo,
so the rollout page can decode them, and logprobs near 0 (a converged policy) whose colours
must still differ.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgrad import semconv
from agentgrad.algorithms.apo import APO_ITEM, candidate_id, critique_group, val_group
from agentgrad.store.protocol import RolloutRequest, Store
from agentgrad.types import LLM, AttemptStatus, JsonResource, MetricRecord, PromptTemplate, Span

TOKENIZER = Path(__file__).resolve().parents[2] / "src" / "agentgrad" / "demo" / "data" / "tiny-calc" / "tokenizer.json"
SEED_PROMPT = "Solve: {question}\nAnswer with a number."
CHILD_PROMPT = "Solve step by step: {question}\nUse the calculator.\nAnswer with a number."


def encode(text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER)).encode(text, add_special_tokens=False).ids


@dataclass
class Runs:
    store: Store
    grpo_rollouts: dict[str, list[str]] = field(default_factory=dict)  # group id → rollout ids
    two_calls: str = ""  # a rollout with two LLM calls, a tool error between them and two rewards
    framework: str = ""  # a rollout whose only spans come from an OpenInference instrumentor
    answer: str = "The answer is 5"


def _llm_span(
    rollout_id: str,
    attempt_id: str,
    span_id: str,
    start: float,
    messages: list[dict[str, Any]],
    answer: str,
    logprobs: list[float] | None = None,
    model: str = "tiny-calc",
) -> Span:
    ids = encode(answer)
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        span_id=span_id,
        name=semconv.SPAN_LLM_CALL,
        start_time=start,
        end_time=start + 0.2,
        attributes={
            semconv.LLM_PROMPT_TOKEN_IDS: [1, 2, 3] + list(range(4, 4 + len(messages))),
            semconv.LLM_COMPLETION_TOKEN_IDS: ids,
            semconv.LLM_LOGPROBS: logprobs if logprobs is not None else [-1e-5] * len(ids),
            semconv.LLM_REQUEST: json.dumps({"model": model, "messages": messages}),
            semconv.LLM_RESPONSE: json.dumps(
                {
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}
                    ]
                }
            ),
            semconv.GEN_AI_REQUEST_MODEL: model,
            semconv.MODEL_VERSION: "v1",
        },
    )


def _finish(
    store: Store, rollout_id: str, attempt_id: str, spans: list[Span], reward: float | None, when: float
) -> None:
    if reward is not None:
        spans = [
            *spans,
            Span(
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                name=semconv.SPAN_REWARD,
                start_time=when,
                end_time=when,
                attributes={semconv.REWARD_VALUE: reward},
            ),
        ]
    store.add_spans(spans)
    store.update_attempt(rollout_id, attempt_id, AttemptStatus.SUCCEEDED)


def _run_group(
    store: Store, requests: list[RolloutRequest], rewards: list[float], agent: str | None = None
) -> list[str]:
    """Enqueue, claim and finish a batch: one LLM call each (inside an agent scope when named)."""
    ids = [r.rollout_id for r in store.enqueue_rollouts(requests)]
    claimed = {c.rollout.rollout_id: c for c in store.dequeue_rollouts(len(ids), worker_id="runner-1")}
    t0 = time.time()
    for rollout_id, reward in zip(ids, rewards, strict=True):
        attempt = claimed[rollout_id].attempt.attempt_id
        spans = [
            _llm_span(
                rollout_id, attempt, f"{rollout_id}-llm", t0, [{"role": "user", "content": "2+3?"}], "The answer is 5"
            )
        ]
        if agent:
            spans.insert(
                0,
                Span(
                    rollout_id=rollout_id,
                    attempt_id=attempt,
                    span_id=f"{rollout_id}-agent",
                    name=semconv.SPAN_AGENT,
                    start_time=t0 - 0.1,
                    end_time=t0 + 0.5,
                    attributes={semconv.AGENT_NAME: agent},
                ),
            )
            spans[1].parent_id = f"{rollout_id}-agent"
        _finish(store, rollout_id, attempt, spans, reward, t0 + 0.3)
    return ids


def fill_runs(store: Store) -> Runs:
    """Two GRPO runs, one SFT run, one APO run (two rounds) and two special rollouts."""
    runs = Runs(store)
    llm = LLM(endpoint="http://127.0.0.1:9/v1", model="tiny-calc")
    grpo_snapshot = store.add_resources({"llm": llm, "agentgrad_policy": {"model_version": "v1"}})
    # GRPO "grpo-a": 2 steps × 2 tasks × group of 2, as GRPO.sample names its groups.
    for step in (1, 2):
        for task in (0, 1):
            group = f"grpo-a-s{step}-t{task}-r0"
            requests = [
                RolloutRequest(
                    input={"question": f"task {task}: what is 2+3?"},
                    mode="train",
                    resources_id=grpo_snapshot.resources_id,
                    metadata={"group_id": group, "step": step},
                )
                for _ in range(2)
            ]
            rewards = [1.0, 0.0] if task == 0 else [1.0, 1.0]  # task 1's group agrees: no signal
            runs.grpo_rollouts[group] = _run_group(store, requests, rewards, agent="solver")
    for run, scale in (("grpo-a", 1.0), ("grpo-b", 0.5)):
        store.add_metrics(
            [
                MetricRecord(
                    run_id=run,
                    step=step,
                    values={
                        "reward/mean": scale * step / 10,
                        "val/reward_mean": scale * (0.1 + step / 20) - (0.2 if step == 10 else 0),
                        "entropy": 1.0 - step / 20,
                        "kl": step / 1000,
                        "tokens_per_second": 500.0 + step,
                        "loss": 1.0 / (step + 1),
                        "adapter/rollouts_without_reward": 0.0,
                        "grpo/groups": 2.0,
                        "clip_fraction": 0.1,
                    },
                )
                for step in range(11)
            ]
        )
    # SFT: its rollouts carry sft_run, its metrics go under sft:<run>.
    _run_group(
        store,
        [
            RolloutRequest(
                input={"question": "sft task"},
                resources_id=grpo_snapshot.resources_id,
                metadata={"sft_run": "s1", "sft_iteration": 0},
            )
        ],
        [1.0],
    )
    store.add_metrics(
        [MetricRecord(run_id="sft:s1", step=s, values={"loss": 2.0 - s / 10, "samples": 4.0}) for s in range(3)]
    )
    # APO: seed (round 0) and one child (round 1), each a snapshot with its lineage and scored by
    # the rewards of its validation group.
    seed, child = PromptTemplate(template=SEED_PROMPT), PromptTemplate(template=CHILD_PROMPT)
    seed_id, child_id = candidate_id("p1", seed), candidate_id("p1", child)
    for template, rid, round_, parent, score in ((seed, seed_id, 0, None, 0.25), (child, child_id, 1, seed_id, 0.75)):
        store.add_resources(
            {
                "llm": llm,
                "prompt": template,
                APO_ITEM: JsonResource(
                    value={
                        "run_id": "p1",
                        "kind": "candidate",
                        "round": round_,
                        "parent": parent,
                        "critique": "Ask for steps." if parent else None,
                        "prompt_name": "prompt",
                    }
                ),
            },
            resources_id=rid,
        )
        group = val_group("p1", rid)
        _run_group(
            store,
            [
                RolloutRequest(
                    input={"question": f"val {i}"},
                    mode="val",
                    resources_id=rid,
                    metadata={"group_id": group, "apo_run": "p1"},
                )
                for i in range(4)
            ],
            [1.0 if i < score * 4 else 0.0 for i in range(4)],
        )
    _run_group(
        store,
        [
            RolloutRequest(
                input={"question": "critique me"},
                resources_id=seed_id,
                metadata={"group_id": critique_group("p1", 1, seed_id), "apo_run": "p1"},
            )
        ],
        [0.0],
    )
    store.add_metrics([MetricRecord(run_id="apo:p1", step=1, values={"best_score": 0.75, "beam_mean": 0.5})])

    # Two LLM calls; the tool answers with an error between them; a reward after each call.
    rollout = store.enqueue_rollout({"question": "two calls"}, rollout_id="ro-two-calls")
    attempt = store.dequeue_rollout().attempt.attempt_id
    t0 = time.time()
    first_messages = [{"role": "system", "content": "You are a calculator."}, {"role": "user", "content": "2+3?"}]
    second_messages = [
        *first_messages,
        {"role": "assistant", "content": "<tool_call>calc</tool_call>"},
        {"role": "tool", "content": "Error: no such tool"},
    ]
    spans = [
        _llm_span(
            rollout.rollout_id,
            attempt,
            "call-1",
            t0,
            first_messages,
            "<tool_call>calc</tool_call>",
            [-1e-5, -0.005, -0.3, -2.5] + [-1e-5] * 20,
        ),
        Span(
            rollout_id=rollout.rollout_id,
            attempt_id=attempt,
            name=semconv.SPAN_REWARD,
            start_time=t0 + 0.3,
            end_time=t0 + 0.3,
            attributes={semconv.REWARD_VALUE: 0.25},
        ),
        _llm_span(rollout.rollout_id, attempt, "call-2", t0 + 1.0, second_messages, runs.answer),
    ]
    _finish(store, rollout.rollout_id, attempt, spans, 1.0, t0 + 2.0)
    runs.two_calls = rollout.rollout_id

    # OpenInference: what an instrumented framework (e.g. LangChain through openinference) records.
    rollout = store.enqueue_rollout({"question": "framework"}, rollout_id="ro-framework")
    attempt = store.dequeue_rollout().attempt.attempt_id
    store.add_spans(
        [
            Span(
                rollout_id=rollout.rollout_id,
                attempt_id=attempt,
                span_id="oi-chain",
                name="RunnableSequence",
                attributes={
                    "openinference.span.kind": "CHAIN",
                    "input.value": '{"question": "capital of France?"}',
                    "output.value": "Paris",
                },
            ),
            Span(
                rollout_id=rollout.rollout_id,
                attempt_id=attempt,
                span_id="oi-llm",
                parent_id="oi-chain",
                name="ChatCompletion",
                attributes={
                    "openinference.span.kind": "LLM",
                    "llm.model_name": "gpt-4o-mini",
                    "llm.input_messages.0.message.role": "system",
                    "llm.input_messages.0.message.content": "Answer in one word.",
                    "llm.input_messages.1.message.role": "user",
                    "llm.input_messages.1.message.content": "What is the capital of France?",
                    "llm.output_messages.0.message.role": "assistant",
                    "llm.output_messages.0.message.content": "Paris",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "lookup",
                    "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"city": "Paris"}',
                },
            ),
        ]
    )
    store.update_attempt(rollout.rollout_id, attempt, AttemptStatus.SUCCEEDED)
    runs.framework = rollout.rollout_id
    return runs
