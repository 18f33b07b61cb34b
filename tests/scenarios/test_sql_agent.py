"""``examples/sql``: the LangGraph write → execute → check → rewrite agent, unchanged, run as training
runs it — through the capture proxy, on the tiny model — on a task of the generated SQL world.

The tiny model cannot write SQL (its reward is 0 here): that test checks the plumbing. Every call
is stored with faithful token ids under its LangGraph node's name, the checker's calls are left
out by the example's ``agent_match`` and the reward span is the execution match of the final query.
The graph's own logic — a rejected query rewritten, an accepted one scored 1 — runs against a
scripted stand-in for a model that can write SQL (``agentgrad.testing.stub``, not a model).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("langgraph", reason="LangGraph is installed by `make frameworks`")
from capture_check import Capture, check_faithful  # noqa: E402

from agentgrad import semconv  # noqa: E402
from agentgrad.adapters.transitions import TransitionAdapter  # noqa: E402
from agentgrad.agents import load_agent  # noqa: E402
from agentgrad.algorithms.grpo import GRPOConfig  # noqa: E402
from agentgrad.config import resolve  # noqa: E402
from agentgrad.proxy import LLMProxy  # noqa: E402
from agentgrad.scenarios.sql.world import WorldConfig, write_world  # noqa: E402
from agentgrad.store import open_store  # noqa: E402
from agentgrad.tasks import read_tasks  # noqa: E402
from agentgrad.trainer import Trainer  # noqa: E402
from agentgrad.types import LLM  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sql"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sql") / "world"
    write_world(out, WorldConfig(train_databases=1, val_databases=1, test_databases=1, questions_per_database=2))
    return out


def test_the_config_trains_the_writer_and_rewriter_only() -> None:
    config = resolve(GRPOConfig, EXAMPLE / "train.yaml")
    pattern = re.compile(config.agent_match)
    assert [bool(pattern.search(name)) for name in ("write_query", "rewrite_query", "check_query")] == [
        True,
        True,
        False,
    ]


def test_extract_query_reads_what_models_reply() -> None:
    extract = load_agent(f"{EXAMPLE / 'sql_agent.py'}:sql_agent").func.__globals__["extract_query"]
    assert extract("Here:\n```sql\nSELECT 1\n```\nor\n```sql\nSELECT 2;\n```") == "SELECT 2;"
    assert extract("The query is select name from t") == "select name from t"
    assert extract("no idea") == "no idea"


def test_a_rejected_query_is_rewritten_and_the_accepted_one_scores_one(world: Path) -> None:
    pytest.importorskip("starlette")
    from agentgrad.testing.stub import StubUpstream

    task = read_tasks(world / "test.jsonl")[0]
    replies = [
        "```sql\nSELECT nme FROM nowhere\n```",
        "Wrong table. THE QUERY IS INCORRECT.",
        f"```sql\n{task['query']}\n```",
        "THE QUERY IS CORRECT.",
    ]
    with (
        StubUpstream(replies) as stub,
        open_store("memory", watchdog=False) as store,
        LLMProxy(store, f"http://127.0.0.1:{stub.port}/v1") as proxy,
    ):
        llm = LLM(endpoint=f"http://127.0.0.1:{stub.port}/v1", model="stand-in", sampling={"temperature": 0.0})
        agent = load_agent(f"{EXAMPLE / 'sql_agent.py'}:sql_agent")
        Trainer(store, proxy=proxy).dev(agent, [task], {"llm": llm}, timeout=60, print_summary=False)
        (rollout,) = store.query_rollouts()
        calls = sorted(
            store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL), key=lambda s: s.sequence_id or 0
        )
        (reward,) = store.query_spans(rollout.rollout_id, name=semconv.SPAN_REWARD)
        (message,) = store.query_spans(rollout.rollout_id, name=semconv.SPAN_MESSAGE)
    assert [s.attributes.get(semconv.AGENT_NAME) for s in calls] == [
        "write_query",
        "check_query",
        "rewrite_query",
        "check_query",
    ]
    assert "Error: error: no such table: nowhere" in str(stub.requests[1]["messages"])  # the checker saw why
    assert reward.attributes[semconv.REWARD_VALUE] == 1.0
    assert message.attributes[semconv.MESSAGE_BODY].startswith("match (after 2 write(s))")


@pytest.mark.tiny_model
def test_the_agent_runs_end_to_end_with_its_node_names(capture: Capture, world: Path) -> None:
    task = {**read_tasks(world / "test.jsonl")[0], "max_turns": 2}  # write, check, rewrite, check
    agent = load_agent(f"{EXAMPLE / 'sql_agent.py'}:sql_agent")
    llm = LLM(endpoint=capture.engine_url, model="tiny", sampling={"temperature": 0.0, "max_tokens": 24})
    Trainer(capture.store, proxy=capture.proxy).dev(agent, [task], {"llm": llm}, timeout=180, print_summary=False)

    (rollout,) = [r for r in capture.store.query_rollouts() if r.input == task]
    attempts = capture.store.get_attempts(rollout.rollout_id)
    assert rollout.status.value == "succeeded", [a.error for a in attempts]
    calls = sorted(
        capture.store.query_spans(rollout.rollout_id, name=semconv.SPAN_LLM_CALL), key=lambda s: s.sequence_id or 0
    )
    names = [s.attributes.get(semconv.AGENT_NAME) for s in calls]
    if capture.model_dir is not None:  # the real tiny model never accepts a query: both turns run
        assert names == ["write_query", "check_query", "rewrite_query", "check_query"], names
    for span in calls:
        check_faithful(span, capture.decode)  # prompt and completion token ids, logprobs, decoded text

    (reward,) = capture.store.query_spans(rollout.rollout_id, name=semconv.SPAN_REWARD)
    assert reward.attributes[semconv.REWARD_VALUE] in (0.0, 1.0)
    (message,) = capture.store.query_spans(rollout.rollout_id, name=semconv.SPAN_MESSAGE)
    body = message.attributes[semconv.MESSAGE_BODY]
    assert (
        "match" in body
        if reward.attributes[semconv.REWARD_VALUE]
        else body.startswith(("the query failed", "different result", "the rows are right"))
    ), body

    config = resolve(GRPOConfig, EXAMPLE / "train.yaml")
    transitions, stats = TransitionAdapter(agent_match=config.agent_match, merge=False).adapt(capture.store, [rollout])
    trained = [name for name in names if name != "check_query"]
    assert [t.agent_name for t in transitions] == trained
    assert stats.calls_other_agents == names.count("check_query") and stats.other_agents <= {"check_query"}
