"""The SQL model's recipe (``agentgrad.scenarios.sql.model``): the habits are the mistakes they
name, the warm-up conversations teach each role what the example agent asks of it, the habit is
drawn anew each time a conversation is trained on, and a (short) build is an ordinary Hugging Face
model directory with the context the scenario needs (the shipped build: test_shipped_models.py)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from agentgrad.scenarios.sql import model as sql_model
from agentgrad.scenarios.sql.model import (
    HABIT_RATE,
    HABITS,
    _encode,
    conversations,
    drop_filter,
    flip_order,
)
from agentgrad.scenarios.sql.prompt import CHECK_PROMPT, CORRECT, INCORRECT, WRITE_PROMPT, sql_reply
from agentgrad.scenarios.sql.reward import execution_match, run_query
from agentgrad.scenarios.sql.world import WorldConfig, write_world

SMALL = WorldConfig(seed=7, train_databases=5, val_databases=2, test_databases=1, questions_per_database=12)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return write_world(tmp_path_factory.mktemp("sql") / "world", SMALL).tasks["train"]


def test_the_habits_are_the_mistakes_they_name() -> None:
    assert drop_filter("SELECT name FROM t WHERE city = 'Rome'") == "SELECT name FROM t"
    assert drop_filter("SELECT a FROM t WHERE b IS NOT NULL ORDER BY b DESC LIMIT 1") == (
        "SELECT a FROM t ORDER BY b DESC LIMIT 1"
    )
    assert drop_filter("SELECT a FROM t") == "SELECT a FROM t"
    assert flip_order("SELECT a FROM t ORDER BY b DESC LIMIT 3") == "SELECT a FROM t ORDER BY b ASC LIMIT 3"
    assert flip_order("SELECT a FROM t ORDER BY b ASC LIMIT 1") == "SELECT a FROM t ORDER BY b DESC LIMIT 1"


def test_a_habit_changes_the_answer_of_the_questions_it_is_for(tasks: list[dict]) -> None:
    habitual = [t for t in tasks if t["skill"] in HABITS]
    assert len(habitual) >= 10
    wrong = sum(
        execution_match(HABITS[t["skill"]](t["query"]), t["query"], t["db_path"]).reward == 0.0 for t in habitual
    )
    assert wrong / len(habitual) >= 0.9  # a mistake RL can find and cure, not a harmless rewrite


def test_the_conversations_teach_each_role_its_part(tasks: list[dict]) -> None:
    items = conversations(tasks, seed=0)
    roles = Counter(c.role for c in items)
    assert roles["write"] == len(tasks) and roles["check"] > 0 and roles["rewrite"] > 0
    by_question = {t["question"]: t for t in tasks}
    for c in items:
        task = by_question[c.user.splitlines()[0].removeprefix("Question: ")]
        if c.role == "write":
            assert c.system == WRITE_PROMPT.format(schema=task["schema"]) and c.reply == sql_reply(task["query"])
            assert (c.habit is not None) == (task["skill"] in HABITS)
            if c.habit is not None:
                assert c.habit == sql_reply(HABITS[task["skill"]](task["query"]))
        elif c.role == "check":
            assert c.system == CHECK_PROMPT.format(schema=task["schema"])
            result = c.user.split("\nResult: ", 1)[1]
            failed = result.startswith("Error") or result == "[]"
            assert c.reply == f"{INCORRECT if failed else CORRECT}."
        else:  # the rewriter fixes a query that failed, and replies as the writer does
            query = c.user.split("\nQuery: ", 1)[1].split("\nResult: ", 1)[0]
            execution = run_query(task["db_path"], query)
            assert execution.rows is None or execution.rows == []
            assert c.reply == sql_reply(task["query"]) and c.user.endswith(f"Feedback: {INCORRECT}.")


def test_the_habit_is_drawn_each_time_a_conversation_is_trained_on(tmp_path: Path, tasks: list[dict]) -> None:
    from agentgrad.demo.tiny import train_tokenizer

    items = [c for c in conversations(tasks, seed=0) if c.habit is not None][:3]
    tokenizer = train_tokenizer([f"{c.system}\n{c.user}\n{c.reply}" for c in items], tmp_path, vocab_size=400)
    rng = random.Random(0)
    for sample in _encode(tokenizer, items):
        assert sample.habit is not None
        prompt = sample.mask.index(1)  # the reply is trained on, the prompt is not
        assert sample.habit.ids[:prompt] == sample.ids[:prompt] and sample.habit.mask.index(1) == prompt
        assert sample.ids[-1] == sample.habit.ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        draws = [sample.draw(rng, HABIT_RATE) is sample.habit for _ in range(2000)]
        assert abs(sum(draws) / len(draws) - HABIT_RATE) < 0.05


def test_a_build_is_a_model_directory_with_a_long_context(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = sql_model.build_sql_model(tmp_path / "m", steps=3, eval_every=3, threads=1, progress=False, world=SMALL)
    build = json.loads((out / "agentgrad_build.json").read_text())
    assert build["format"] == sql_model.BUILD_FORMAT and build["steps"] == 3
    assert 0.0 <= build["val_greedy_writer_success"] <= 1.0
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.max_position_embeddings == sql_model.CONTEXT >= 4096
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == model.config.vocab_size and tokenizer.chat_template


def test_a_build_of_no_steps_is_the_untrained_model(tmp_path: Path) -> None:
    """``agentgrad models build-sql --steps 0``: the data prepared and the model written untrained
    (once, the learning-rate schedule divided by the zero steps)."""
    out = sql_model.build_sql_model(tmp_path / "m", steps=0, threads=1, progress=False, world=SMALL)
    build = json.loads((out / "agentgrad_build.json").read_text())
    assert build["steps"] == 0 and not [key for key in build if key.startswith("val_greedy")]
    assert (out / "config.json").is_file()
