"""SFT selection and export on traces captured through the real path (runner → proxy → upstream).

The upstream is the proxy package's scripted stub (one token per character), so these run in
seconds; the tiny-model training run lives in ``test_sft_training.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agentgrad.algorithms.sft import (
    EmptySelectionError,
    SelectionCriteria,
    export_samples,
    select_chat_samples,
    select_transitions,
)
from agentgrad.cli import main
from agentgrad.cli.algorithms import add_commands  # noqa: F401  (the CLI module must import cleanly)
from agentgrad.demo.agent import calc_agent
from agentgrad.proxy import LLMProxy, ProxyResourcesHook
from agentgrad.store.sqlite import SqliteStore
from agentgrad.testing.stub import StubUpstream, tool_reply
from agentgrad.trainer import Trainer
from agentgrad.types import LLM

# The stub always computes 2 + 3 and answers 5: right for the first two tasks, wrong for the third.
TASKS = [
    {"question": "What is 2 + 3?", "answer": 5},
    {"question": "What is 2 + 3?", "answer": 5},
    {"question": "What is 2 + 4?", "answer": 6},
]


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Iterator[SqliteStore]:
    """A store holding the three rollouts above, run by a runner whose LLM calls went through the proxy."""
    path = tmp_path_factory.mktemp("sft") / "store.db"
    store = SqliteStore(path)
    with StubUpstream([tool_reply("calculator", {"expression": "2 + 3"}), "The answer is 5."]) as upstream:
        with LLMProxy(store, f"http://127.0.0.1:{upstream.port}/v1") as proxy:
            trainer = Trainer(store, runner_options={"resources_hook": ProxyResourcesHook(proxy.base_url)})
            report = trainer.dev(
                calc_agent, TASKS, {"llm": LLM(endpoint="unused", model="stub-model")}, print_summary=False
            )
    assert report.rewards == [1.0, 1.0, 0.0] and report.no_llm_calls == 0
    yield store
    store.close()


def test_transitions_keep_successes_deduplicated(captured) -> None:
    transitions, funnel = select_transitions(captured, SelectionCriteria(min_reward=1.0))
    stages = dict(funnel.stages)
    assert stages["succeeded rollouts in the store"] == 3 and stages["reward >= 1.0"] == 2
    # The stub's token ids (one per character of the JSON request) never extend each other, so
    # its two turns stay two sequences; a real chat template merges them (see the tiny-model test).
    assert stages["captured LLM calls"] == 4 and stages["sequences after merging multi-turn calls"] == 4
    assert len(transitions) == 2  # the two successful rollouts are the same conversation: deduplicated
    assert {t.reward for t in transitions} == {1.0}


def test_chat_samples_fold_turns_and_filter_agents(captured) -> None:
    samples, _ = select_chat_samples(captured, SelectionCriteria(min_reward=None, dedupe=False))
    assert len(samples) == 3  # one complete conversation per rollout
    roles = [m["role"] for m in samples[0]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert samples[0]["tools"][0]["function"]["name"] == "calculator"
    assert {s["metadata"]["reward"] for s in samples} == {0.0, 1.0}


@pytest.mark.parametrize(
    ("criteria", "culprit"),
    [
        (SelectionCriteria(min_reward=2.0), "'reward >= 2.0' removed everything (all 3 left after"),
        (SelectionCriteria(agent_match="^planner$"), "'agent matches '^planner$'' removed everything"),
        (SelectionCriteria(modes=("val",)), "'mode in ['val']' removed everything"),
        (SelectionCriteria(since=4e9), "'ended since 4000000000.0' removed everything"),
    ],
)
def test_empty_selection_names_the_filter(captured, criteria, culprit) -> None:
    for select in (select_transitions, select_chat_samples):
        with pytest.raises(EmptySelectionError) as info:
            select(captured, criteria)
        assert culprit in str(info.value)


def test_empty_store_says_so(tmp_path) -> None:
    with (
        SqliteStore(tmp_path / "empty.db") as store,
        pytest.raises(EmptySelectionError, match="'succeeded rollouts in the store'"),
    ):
        select_transitions(store, SelectionCriteria())


def test_export_jsonl_and_parquet_round_trip(captured, tmp_path) -> None:
    samples, _ = select_chat_samples(captured, SelectionCriteria(min_reward=None))
    jsonl = export_samples(samples, tmp_path / "out.jsonl")
    assert [json.loads(line) for line in jsonl.read_text().splitlines()] == samples
    import pyarrow.parquet as pq

    table = pq.read_table(export_samples(samples, tmp_path / "out.parquet")).to_pylist()
    assert [json.loads(row["messages"]) for row in table] == [s["messages"] for s in samples]
    assert [json.loads(row["tools"]) for row in table] == [s["tools"] for s in samples]
    assert [row["reward"] for row in table] == [s["metadata"]["reward"] for s in samples]


def test_export_command(captured, tmp_path, capsys) -> None:
    output = tmp_path / "cli.parquet"
    assert main(["export", "--store", f"sqlite://{captured.path}", "--min-reward", "1", "--output", str(output)]) == 0
    assert "wrote 1 conversation(s)" in capsys.readouterr().out
    import pyarrow.parquet as pq

    assert pq.read_table(output).num_rows == 1
    assert (
        main(
            [
                "export",
                "--store",
                f"sqlite://{captured.path}",
                "--agent-match",
                "nobody",
                "--output",
                str(tmp_path / "none.jsonl"),
            ]
        )
        == 1
    )
    assert "agent matches 'nobody'" in capsys.readouterr().err
