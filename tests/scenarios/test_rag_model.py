"""The RAG model's recipe (``agentgrad.scenarios.rag.model``): the warm-up conversations are the
searcher's, with the real search tool's results and the tool as the Agents SDK sends it; the habit
answers a 2-hop question after one search (a wrong answer); only the model's replies are trained
on; a (short) build is a model directory with a 4,096-token context."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agentgrad.demo.tiny import train_tokenizer
from agentgrad.demo.warmup import shared_prefix, without_prefix
from agentgrad.scenarios.rag import model as rag_model
from agentgrad.scenarios.rag.files import balanced, write_split
from agentgrad.scenarios.rag.model import (
    SEARCH_TOOL,
    conversations,
    copied,
    dense,
    encode,
    first_search,
    tokenizer_text,
    tool_call_text,
)
from agentgrad.scenarios.rag.prompt import INSTRUCTIONS
from agentgrad.scenarios.rag.reward import score_reply
from agentgrad.scenarios.rag.search import open_index
from agentgrad.scenarios.rag.world import generate_split

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rag"


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    files = write_split(tmp_path_factory.mktemp("rag"), "val", seed=3, questions=20)
    return generate_split("val", 3), open_index(files.corpus), files.corpus


def test_the_conversations_search_then_answer_and_the_habit_answers_early(split) -> None:  # type: ignore[no-untyped-def]
    world, index, _ = split
    for question in balanced(world.questions, 20):
        right, habit = conversations(question, world, index)
        assert right[0] == {"role": "system", "content": INSTRUCTIONS} and right[1]["content"] == question.question
        queries = [m["tool_calls"][0]["function"]["arguments"]["query"] for m in right if m.get("tool_calls")]
        titles = [world.by_id[doc].title for doc in question.support]
        assert queries == [copied(title) for title in titles]
        first_result = next(m["content"] for m in right if m["role"] == "tool")
        assert first_result.startswith(f"[1] {titles[0]}: ")  # the search finds the entity it names
        assert score_reply(right[-1]["content"], question.answer).em == 1.0
        if question.hops == 1:
            assert habit is None
        else:
            assert habit is not None and sum(m["role"] == "tool" for m in habit) == 1
            assert score_reply(habit[-1]["content"], question.answer).em == 0.0


def test_the_replies_are_marked_and_the_system_turn_is_shared(split, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    world, index, _ = split
    pairs = [conversations(q, world, index) for q in balanced(world.questions, 6)]
    texts = [m["content"] or "" for right, _ in pairs for m in right] + [json.dumps(SEARCH_TOOL)]
    tokenizer = train_tokenizer(texts, tmp_path, vocab_size=600)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    samples = []
    for right, _ in pairs:
        sample = encode(tokenizer, right)
        trained = [t for t, m in zip(sample.ids, sample.mask, strict=True) if m]
        replies = [m for m in right if m["role"] == "assistant"]
        expected = "".join(
            (
                tool_call_text(m["tool_calls"][0]["function"]["arguments"]["query"])
                if m.get("tool_calls")
                else m["content"]
            )
            + "<|im_end|>"
            for m in replies
        )
        assert tokenizer.decode(trained) == expected and trained.count(im_end) == len(replies)
        samples.append(sample)
    length = shared_prefix(samples)
    assert 0 < length < min(s.mask.index(1) for s in samples)
    assert "<tools>" in tokenizer.decode(samples[0].ids[:length])
    assert without_prefix(samples[1], length).ids == samples[1].ids[length:]
    # the build trains on every token after the shared system turn, the search results included
    trained = dense(without_prefix(samples[1], length))
    assert trained.ids == samples[1].ids[length:] and set(trained.mask) == {1}


def test_a_name_is_copied_token_for_token(split, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The query and the answer spell a name with the tokens the question and the entries use."""
    world, index, _ = split
    pairs = [conversations(q, world, index) for q in balanced(world.questions, 20)]
    texts = [m["content"] or "" for right, _ in pairs for m in right]
    texts = [INSTRUCTIONS, json.dumps(SEARCH_TOOL), *map(tokenizer_text, texts)]  # as the recipe does
    tokenizer = train_tokenizer(texts, tmp_path, vocab_size=rag_model.VOCAB_SIZE)
    for question in balanced(world.questions, 20):
        right, _ = conversations(question, world, index)
        title = world.by_id[question.support[0]].title
        name = tokenizer.encode(copied(title), add_special_tokens=False)
        # spelled in letters and short letter groups, the tokens of every other name too
        assert max(len(tokenizer.decode([t]).strip()) for t in name) <= 4, tokenizer.tokenize(copied(title))
        for text in (question.question, right[3]["content"], tool_call_text(copied(title))):
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert any(ids[i : i + len(name)] == name for i in range(len(ids))), (text, title)
        answer = tokenizer.encode(copied(question.answer), add_special_tokens=False)
        source = right[-2]["content"]  # the last search result states the answer
        ids = tokenizer.encode(source, add_special_tokens=False)
        assert any(ids[i : i + len(answer)] == answer for i in range(len(ids))), (source, question.answer)
        reply = tokenizer.encode(right[-1]["content"], add_special_tokens=False)
        assert any(reply[i : i + len(answer)] == answer for i in range(len(reply)))


def test_the_reading_drill_keeps_the_habit_and_trains_the_last_answer_once_more(split, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A 1-hop question: its conversation. A 2-hop one: its conversation with the habit as a twin
    (drawn as in the warm-up), and the answer after the second result alone, every search before
    it untrained context."""
    world, index, _ = split
    questions = balanced(world.questions, 6)
    pairs = [conversations(q, world, index) for q in questions]
    texts = [m["content"] or "" for right, _ in pairs for m in right] + [json.dumps(SEARCH_TOOL)]
    tokenizer = train_tokenizer(texts, tmp_path, vocab_size=600)
    for question, (right, habit) in zip(questions, pairs, strict=True):
        samples = rag_model.reading_samples(tokenizer, [conversations(question, world, index)])
        if question.hops == 1:
            assert samples == [encode(tokenizer, right)]
            continue
        whole, answer = samples
        assert whole == replace(encode(tokenizer, right), habit=encode(tokenizer, habit))
        assert answer.ids == whole.ids
        trained = [t for t, m in zip(answer.ids, answer.mask, strict=True) if m]
        assert tokenizer.decode(trained) == rag_model.answer_text(question.answer) + "<|im_end|>"
        assert answer.mask[-len(trained) :] == [1] * len(trained) and set(answer.mask[: -len(trained)]) == {0}


def test_the_search_tool_is_rendered_as_the_agents_sdk_sends_it(split) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("agents", reason="the OpenAI Agents SDK is installed by `make frameworks`")
    from agents import Runner

    from agentgrad.testing.stub import StubUpstream
    from agentgrad.types import LLM

    sys.path.insert(0, str(EXAMPLE))
    try:
        import rag_agent
    finally:
        sys.path.remove(str(EXAMPLE))
    _, _, corpus = split
    with StubUpstream(["<answer>x</answer>"]) as stub:
        llm = LLM(endpoint=f"http://127.0.0.1:{stub.port}/v1", model="m", sampling={"max_tokens": 8})
        asyncio.run(Runner.run(rag_agent.build_agent(llm, str(corpus)), "Who?", max_turns=2))
    (request,) = stub.requests
    assert request["tools"] == [SEARCH_TOOL]
    assert request["messages"][0] == {"role": "system", "content": INSTRUCTIONS}


def test_a_build_is_a_model_directory_with_a_long_context(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out = rag_model.build_rag_model(
        tmp_path / "m",
        steps=2,
        eval_every=2,
        threads=1,
        progress=False,
        questions=40,
        worlds=2,
        drill_worlds=1,
        drill_steps=3,
        answer_worlds=1,
        answer_steps=2,
        reading_worlds=1,
        reading_steps=2,
    )
    build = json.loads((out / "agentgrad_build.json").read_text())
    assert build["format"] == rag_model.BUILD_FORMAT and build["questions"] == 40
    assert build["drill_questions"] == rag_model.DRILL_PER_WORLD
    assert build["answer_drill_questions"] == rag_model.ANSWER_PER_WORLD
    assert build["reading_drill_questions"] == rag_model.READING_PER_WORLD
    phases = [(name, phase["steps"]) for name, phase in build["skills"].items()]
    assert phases == [("copy", 3), ("answer", 2), ("reading", 2)]
    assert 0.0 <= build["val_greedy_em"] <= 1.0
    assert AutoModelForCausalLM.from_pretrained(out).config.max_position_embeddings == rag_model.CONTEXT >= 4096


def test_the_drills_are_the_first_and_second_turns_and_each_stops_when_its_probe_passes(split, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from agentgrad.demo.tiny import write_model
    from agentgrad.demo.warmup import Prepared, Recipe, Skill, build_model

    world, index, _ = split
    questions = balanced(world.questions, 8)
    rights = [conversations(q, world, index)[0] for q in questions]
    for question, right in zip(questions, rights, strict=True):
        assert first_search(question, world) == right[:3]  # the conversation's first search, no result
        second = rag_model.second_turn(question, world, index)
        assert second[:4] == right[:4] and second[3]["role"] == "tool"  # after the first result…
        if question.hops == 1:  # …the answer, or the second search
            assert second == right
        else:
            assert second == right[:5] and len(right) == 7
            assert second[-1]["tool_calls"][0]["function"]["arguments"]["query"] == copied(
                world.by_id[question.support[1]].title
            )
    probes: list[str] = []

    def prepare(data_dir: Path, build_dir: Path) -> Prepared:
        texts = [INSTRUCTIONS, json.dumps(SEARCH_TOOL), *(q.question for q in questions)]
        tokenizer = train_tokenizer(texts, build_dir, vocab_size=400)
        model = write_model(build_dir, tokenizer, 0)

        def phase(name: str, convs: list[rag_model.Conversation], passes_at: int) -> Skill:
            def probe() -> float:
                probes.append(name)
                share = rag_model.probe_turn(model, tokenizer, convs[:2])  # a real greedy probe, 0..1
                assert 0.0 <= share <= 1.0
                return 1.0 if probes.count(name) == passes_at else share / 2

            return Skill(name, [encode(tokenizer, c) for c in convs], probe, 0.9, 2, 50)

        copy = phase("copy", [first_search(q, world) for q in questions], passes_at=2)
        answer = phase("answer", [rag_model.second_turn(q, world, index) for q in questions], passes_at=1)
        reading = phase("reading", rights, passes_at=2)
        reading = replace(reading, threshold=None, max_steps=5, peak_lr=1e-4, decay=True)  # all its steps

        def evaluate() -> dict[str, float]:
            probes.append("evaluate")
            return {"em": float(len(probes))}

        return Prepared(model, tokenizer, copy.samples, evaluate, {}, skills=(copy, answer), finish=(reading,))

    recipe = Recipe("drill-test", 1, 4, 1e-3, 0.0, shipped=tmp_path / "none", what="a test model")
    out = build_model(tmp_path / "m", recipe, prepare, steps=1, seed=0, threads=1, progress=False, eval_every=1)
    build = json.loads((out / "agentgrad_build.json").read_text())
    # in order, each probed every 2 steps until it passed; the finishing phase ran its 5 steps
    # after the warm-up (evaluated at its step 1), and the model was evaluated again after it
    assert probes == ["copy", "copy", "answer", "evaluate", "reading", "reading", "evaluate"]
    assert build["skills"] == {
        "copy": {"steps": 4, "probe": 1.0},
        "answer": {"steps": 2, "probe": 1.0},
        "reading": {"steps": 5, "probe": 1.0},
    }
    assert build["val_greedy_em"] == 7.0  # the manifest holds the last evaluation
