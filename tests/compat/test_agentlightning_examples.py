"""The Agent Lightning-style examples (examples/agentlightning), unchanged but for their import line,
with ``dev`` (the tiny model's engine behind a capture proxy) and ``fit`` (VERL → GRPO on a random
tiny model, or APO): every call captured with token ids and the framework's own agent names, and
``agent_match`` selecting exactly the named agents' calls."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from capture_check import Capture

from agentgrad import semconv
from agentgrad.adapters import TransitionAdapter
from agentgrad.store.protocol import Store
from agentgrad.types import Rollout, RolloutStatus

pytestmark = pytest.mark.tiny_model  # runs last: see tests/conftest.py
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


def verl_config(model_dir: Path, out: Path, *, max_tokens: int = 24) -> dict[str, Any]:
    """The reference's VERL config shape, scaled to one step of 2 tasks × 2 samples on CPU."""
    return {
        "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
        "data": {"train_batch_size": 2, "max_prompt_length": 4096, "max_response_length": max_tokens},
        "actor_rollout_ref": {
            "rollout": {"n": 2, "name": "vllm", "tensor_model_parallel_size": 1, "gpu_memory_utilization": 0.6},
            "actor": {
                "ppo_mini_batch_size": 2,
                "ppo_micro_batch_size_per_gpu": 4,
                "optim": {"lr": 1e-3},
                "use_kl_loss": False,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.3,
                "fsdp_config": {"param_offload": True},
            },
            "model": {"path": str(model_dir), "use_remove_padding": True},
        },
        "trainer": {
            "n_gpus_per_node": 1,
            "val_before_train": True,
            "critic_warmup": 0,
            "logger": ["console"],
            "experiment_name": "compat",
            "total_training_steps": 1,
            "test_freq": 1,
            "device": "cpu",
            "default_local_dir": str(out),
        },
    }


def calls_of(store: Store, rollouts: list[Rollout]) -> list[Any]:
    return [s for r in rollouts for s in store.query_spans(r.rollout_id, name=semconv.SPAN_LLM_CALL)]


def check_captured(store: Store, rollouts: list[Rollout], names: set[str]) -> list[Any]:
    """Every rollout succeeded with LLM calls; every call has token ids and one of ``names``."""
    assert rollouts and all(r.status == RolloutStatus.SUCCEEDED for r in rollouts), [
        a.error for r in rollouts for a in store.get_attempts(r.rollout_id) if a.error
    ]
    calls = calls_of(store, rollouts)
    assert all(r.llm_calls > 0 for r in rollouts)
    assert all(
        s.attributes.get(semconv.LLM_PROMPT_TOKEN_IDS) and s.attributes.get(semconv.LLM_COMPLETION_TOKEN_IDS)
        for s in calls
    )
    seen = {s.attributes.get(semconv.AGENT_NAME) for s in calls}
    assert seen <= names, f"agent names {seen}, expected among {names}"
    return calls


def check_selected(store: Store, rollouts: list[Rollout], match: str, selected: set[str]) -> None:
    """``agent_match`` gives transitions of exactly the ``selected`` agents' calls, each carrying its
    rollout's reward (final credit)."""
    transitions, stats = TransitionAdapter("final", agent_match=match).adapt(store, rollouts)
    names = [s.attributes.get(semconv.AGENT_NAME) for s in calls_of(store, rollouts)]
    assert len(transitions) == sum(n in selected for n in names) > 0
    assert {t.agent_name for t in transitions} <= selected
    rewards = {r.rollout_id: r.reward for r in rollouts}
    assert all(t.reward == rewards[t.rollout_id] for t in transitions)
    assert stats.calls_other_agents == sum(n not in selected for n in names)


def train_rollouts(store: Store) -> list[Rollout]:
    return [r for r in store.query_rollouts() if r.mode == "train"]


# ---- the LangGraph SQL agent: write_query → execute_query → check_query → rewrite_query ---------------

SQL_NAMES = {"write_query", "check_query", "rewrite_query"}


@pytest.fixture
def sql_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    data = tmp_path / "data"
    data.mkdir()
    with sqlite3.connect(data / "shop.sqlite") as db:
        db.execute("CREATE TABLE items (name TEXT, price INTEGER)")
        db.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 2), ("book", 12), ("lamp", 30)])
    monkeypatch.setenv("SQL_AGENT_DATA_DIR", str(data))  # runner processes inherit it
    return data


@pytest.mark.parametrize("n_workers", [1, 2], ids=["in-process", "runner-processes"])
def test_sql_agent_dev_captures_node_names(
    capture: Capture, sql_data: Path, load_example: Callable[..., ModuleType], n_workers: int
) -> None:
    example = load_example("sql_agent")
    agl = example.agl
    trainer = agl.Trainer(
        n_workers=n_workers,
        initial_resources={
            "main_llm": agl.LLM(endpoint=capture.engine_url, model="tiny", sampling_parameters={"temperature": 0.7})
        },
    )
    report = trainer.dev(example.LitSQLAgent(), example.TASKS[:2])
    rollouts = [trainer.store.get_rollout(r.rollout_id) for r in report.rollouts]
    calls = check_captured(trainer.store, rollouts, SQL_NAMES)
    assert {s.attributes[semconv.AGENT_NAME] for s in calls} >= {"write_query", "check_query"}
    check_selected(trainer.store, rollouts, "write|rewrite", {"write_query", "rewrite_query"})


@pytest.mark.parametrize("n_runners", [1, 2], ids=["in-process", "runner-processes"])
def test_sql_agent_fit_with_verl_trains_only_writer_and_rewriter(
    tiny_model_dir: Path,
    tmp_path: Path,
    sql_data: Path,
    load_example: Callable[..., ModuleType],
    agentlightning_alias: ModuleType,
    n_runners: int,
) -> None:
    example = load_example("sql_agent", alias=True)  # `import agentlightning as agl`, as Agent Lightning users write
    agl = example.agl
    assert agl is agentlightning_alias
    trainer = agl.Trainer(
        n_runners=n_runners,
        algorithm=agl.VERL(verl_config(tiny_model_dir, tmp_path / "run")),
        adapter={"agent_match": "write|rewrite"},
    )
    result = trainer.fit(example.LitSQLAgent(), train_dataset=example.TASKS[:2], val_dataset=example.TASKS[2:3])
    assert result.steps == 1 and [step for step, _ in result.validation] == [0, 1]
    rollouts = train_rollouts(trainer.store)
    assert len(rollouts) == 4  # 2 tasks × rollout.n 2
    calls = check_captured(trainer.store, rollouts, SQL_NAMES)
    assert {s.attributes[semconv.AGENT_NAME] for s in calls} >= {"write_query", "check_query"}
    check_selected(trainer.store, rollouts, "write|rewrite", {"write_query", "rewrite_query"})
    llm = trainer.store.get_resources(rollouts[0].resources_id).items["main_llm"]
    assert llm.sampling_parameters == {"temperature": 1.0, "max_tokens": 24}  # VERL's rollout settings, applied
    assert (tmp_path / "run" / "model" / "config.json").is_file()


# ---- the AutoGen calculator agent (calc_x) ----------------------------------------------------------


def test_autogen_calc_agent_dev_and_fit(
    capture: Capture, tiny_model_dir: Path, tmp_path: Path, load_example: Callable[..., ModuleType]
) -> None:
    pytest.importorskip("autogen_agentchat")
    example = load_example("calc_agent")
    agl = example.agl
    tasks = [
        {"id": "a", "question": "What is 12 + 7?", "result": "19"},
        {"id": "b", "question": "Calculate 6 * 7.", "result": "42"},
    ]
    trainer = agl.Trainer(
        n_workers=1,
        initial_resources={
            "main_llm": agl.LLM(
                endpoint=capture.engine_url, model="tiny", sampling_parameters={"temperature": 0.0, "max_tokens": 48}
            )
        },
    )
    report = trainer.dev(example.calc_agent, tasks)
    rollouts = [trainer.store.get_rollout(r.rollout_id) for r in report.rollouts]
    check_captured(trainer.store, rollouts, {"calc"})
    assert all(r.reward is not None for r in rollouts)  # emitted with agl.emit_reward

    fit = agl.Trainer(
        n_runners=1,
        algorithm=agl.VERL(verl_config(tiny_model_dir, tmp_path / "run", max_tokens=16)),
        adapter={"agent_match": "^calc$"},
    )
    assert fit.fit(example.calc_agent, train_dataset=tasks).steps == 1
    rollouts = train_rollouts(fit.store)
    check_captured(fit.store, rollouts, {"calc"})
    check_selected(fit.store, rollouts, "^calc$", {"calc"})


# ---- the OpenAI Agents SDK agent --------------------------------------------------------------------


def test_agents_sdk_agent_dev_and_fit(
    capture: Capture,
    tiny_model_dir: Path,
    tmp_path: Path,
    load_example: Callable[..., ModuleType],
    agentlightning_alias: ModuleType,
) -> None:
    pytest.importorskip("agents")
    example = load_example("agents_sdk_agent", alias=True)
    agl = example.agl
    tasks = [{"question": "What is 12 + 7?", "answer": 19}, {"question": "Calculate 6 * 7.", "answer": 42}]
    trainer = agl.Trainer(
        n_workers=1,
        initial_resources={
            "main_llm": agl.LLM(
                endpoint=capture.engine_url, model="tiny", sampling_parameters={"temperature": 0.0, "max_tokens": 24}
            )
        },
    )
    report = trainer.dev(example.LitMathAgent(), tasks)
    rollouts = [trainer.store.get_rollout(r.rollout_id) for r in report.rollouts]
    calls = check_captured(trainer.store, rollouts, {"triage", "math"})
    assert "triage" in {s.attributes[semconv.AGENT_NAME] for s in calls}  # the SDK's Agent.name

    fit = agl.Trainer(
        n_runners=1,
        algorithm=agl.VERL(verl_config(tiny_model_dir, tmp_path / "run", max_tokens=16)),
        adapter={"agent_match": "triage"},
    )
    assert fit.fit(example.LitMathAgent(), train_dataset=tasks).steps == 1
    rollouts = train_rollouts(fit.store)
    check_captured(fit.store, rollouts, {"triage", "math"})
    check_selected(fit.store, rollouts, "triage", {"triage"})


# ---- the APO room selector --------------------------------------------------------------------------


def test_room_selector_dev_and_apo_fit(
    capture: Capture, load_example: Callable[..., ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    from openai import AsyncOpenAI

    from agentgrad.testing.stub import StubUpstream

    example = load_example("room_selector")
    agl = example.agl
    monkeypatch.setenv("OPENAI_BASE_URL", capture.proxy.url + "/v1")  # the agent's OpenAI() → the capture proxy
    monkeypatch.setenv("OPENAI_API_KEY", "dummy")
    seed = example.prompt_template_baseline()
    trainer = agl.Trainer(
        n_workers=1, store=capture.store, llm_proxy=capture.proxy, initial_resources={"prompt_template": seed}
    )
    report = trainer.dev(example.room_selector, example.TASKS[:2])
    rollouts = [capture.store.get_rollout(r.rollout_id) for r in report.rollouts]
    check_captured(capture.store, rollouts, {"room_selector"})  # a plain OpenAI call: the rollout's agent name

    edit = "Book a free room at {time} for {attendees} people needing {needs}; name it."
    with StubUpstream([f"Say which room. <prompt>{edit}</prompt>"]) as critic:
        algo = agl.APO(
            AsyncOpenAI(base_url=f"http://127.0.0.1:{critic.port}/v1", api_key="dummy"),
            val_batch_size=2,
            gradient_batch_size=2,
            beam_width=1,
            branch_factor=1,
            beam_rounds=1,
            rollout_batch_timeout=120,
        )
        fit = agl.Trainer(
            algorithm=algo,
            n_runners=1,
            store=capture.store,
            llm_proxy=capture.proxy,
            initial_resources={"prompt_template": seed},
            adapter=agl.TraceToMessages(),
        )
        result = fit.fit(example.room_selector, train_dataset=example.TASKS[:2], val_dataset=example.TASKS[2:])
    assert {c.template.template for c in result.candidates} == {seed.template, edit}
    assert result.best.score is not None and len(critic.requests) == 2  # one critique, one edit
