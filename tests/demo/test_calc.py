"""The calculator task: splits, safe evaluation, answer checking."""

from __future__ import annotations

import json

import pytest

from agentgrad.demo import calc


def test_problems_are_deterministic_json_and_disjoint() -> None:
    train = calc.generate_problems(500, seed=0, split="train")
    assert train == calc.generate_problems(500, seed=0, split="train")
    assert json.loads(json.dumps(train)) == train
    val = calc.generate_problems(200, seed=1, split="val")
    test = calc.generate_problems(200, seed=2, split="test")
    questions = [{p["question"] for p in s} for s in (train, val, test)]
    assert not (questions[0] & questions[1]) and not (questions[0] & questions[2]) and not (questions[1] & questions[2])
    assert len(questions[0]) == 500
    for p in train[:50]:
        assert calc.run_calculator(calc.expression_of(p["question"])) == str(p["answer"])


def test_bad_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split"):
        calc.generate_problems(1, 0, "dev")


@pytest.mark.parametrize(
    "expression,expected",
    [
        ("37 * 12 + 5", "449"),
        ("(2 + 3) * 4", "20"),
        ("7 / 2", "3.5"),
        ("-3 + 1", "-2"),
        ("8 / 4", "2"),
    ],
)
def test_calculator_evaluates(expression: str, expected: str) -> None:
    assert calc.run_calculator(expression) == expected


@pytest.mark.parametrize("expression", ["__import__('os')", "2 ** 999999", "1 / 0", "", "2 +", "x" * 300, "9**9**9"])
def test_calculator_refuses_bad_input_with_text(expression: str) -> None:
    assert calc.run_calculator(expression).startswith("Error:")


def test_check_answer_uses_last_number() -> None:
    assert calc.check_answer("The answer is 449.", 449)
    assert calc.check_answer("12 + 5 = 1,017", 1017)
    assert not calc.check_answer("The answer is 448.", 449)
    assert not calc.check_answer("no idea", 449)
    assert calc.check_answer("It is -532", "-532")


def test_tool_schema_is_openai_shaped() -> None:
    fn = calc.CALCULATOR_TOOL["function"]
    assert calc.CALCULATOR_TOOL["type"] == "function" and fn["name"] == "calculator"
    assert fn["parameters"]["required"] == ["expression"]


def test_in_words_tells_spelled_from_symbol_questions() -> None:
    problems = calc.generate_problems(200, 0)
    spelled = [p["question"] for p in problems if calc.in_words(p["question"])]
    written = [p["question"] for p in problems if not calc.in_words(p["question"])]
    assert spelled and written
    assert all(not any(op in q for op in "+-*") for q in spelled)
    assert all(any(f" {op} " in q for op in "+-*") for q in written)


def test_validation_by_kind_splits_each_validation_into_words_and_symbols() -> None:
    from agentgrad import semconv
    from agentgrad.demo.run import validation_by_kind
    from agentgrad.store.memory import MemoryStore
    from agentgrad.types import AttemptStatus, Span

    store = MemoryStore()
    # two validations (resources r0 then r1) of the same three questions, and a train rollout that does not count
    runs = [("r0", [1.0, 0.0, 0.0]), ("r1", [1.0, 1.0, 0.0])]
    questions = ["What is 3 times 4?", "What is 5 plus 6?", "What is 3 * 4?"]
    for resources_id, rewards in runs:
        for question, reward in zip(questions, rewards, strict=True):
            store.enqueue_rollout({"question": question, "answer": 0}, mode="val", resources_id=resources_id)
            claimed = store.dequeue_rollout("w")
            rid, aid = claimed.rollout.rollout_id, claimed.attempt.attempt_id
            store.add_span(
                Span(
                    rollout_id=rid, attempt_id=aid, name=semconv.SPAN_REWARD, attributes={semconv.REWARD_VALUE: reward}
                )
            )
            store.update_attempt(rid, aid, AttemptStatus.SUCCEEDED)
    store.enqueue_rollout({"question": "What is 1 * 1?", "answer": 1}, mode="train")
    assert validation_by_kind(store, [0, 5]) == {0: {"words": 0.5, "symbols": 0.0}, 5: {"words": 1.0, "symbols": 0.0}}
