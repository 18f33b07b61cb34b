"""The RAG world: deterministic, disjoint splits, answerable questions, the reward, the search tool."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentgrad.scenarios.rag.files import DEFAULT_QUESTIONS, write_split
from agentgrad.scenarios.rag.reward import exact_match, extract_answer, normalize_answer, score_reply, token_f1
from agentgrad.scenarios.rag.search import (
    MAX_QUERY_CHARS,
    CorpusError,
    QueryError,
    build_index,
    index_path,
    open_index,
    run_search,
)
from agentgrad.scenarios.rag.world import SIZES, SPLITS, generate_split, split_of


@pytest.fixture(scope="module")
def worlds() -> dict[str, object]:
    return {split: generate_split(split, 0) for split in SPLITS}


@pytest.fixture(scope="module")
def test_files(tmp_path_factory: pytest.TempPathFactory):
    return write_split(tmp_path_factory.mktemp("rag"), "test", seed=0)


def _mentions(text: str, answer: str) -> bool:
    return f" {normalize_answer(answer)} " in f" {normalize_answer(text)} "


def test_deterministic_from_the_seed(worlds) -> None:
    again = generate_split("val", 0)
    assert again == worlds["val"]
    other = generate_split("val", 1)
    assert {d.id for d in other.documents} != {d.id for d in again.documents}


def test_sizes_and_hops(worlds) -> None:
    total = sum(len(w.documents) for w in worlds.values())
    assert 2000 <= total <= 5000, total  # "a few thousand short documents"
    for split, world in worlds.items():
        size = SIZES[split]
        assert len(world.documents) == size.people + size.places + size.organisations
        assert {q.hops for q in world.questions} == {1, 2}
        assert len({q.question for q in world.questions}) == len(world.questions)
        assert all(len(d.text) < 200 for d in world.documents)


@pytest.mark.parametrize("seed", [0, 7])
def test_splits_never_share_a_document_or_an_entity(seed: int) -> None:
    worlds = {split: generate_split(split, seed) for split in SPLITS}
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                ids_a, ids_b = {d.id for d in worlds[a].documents}, {d.id for d in worlds[b].documents}
                assert not ids_a & ids_b
                assert not {d.text for d in worlds[a].documents} & {d.text for d in worlds[b].documents}
                titles_b = {d.title for d in worlds[b].documents}
                assert not any(t in d.text for d in worlds[a].documents for t in list(titles_b)[:50])
    for split, world in worlds.items():
        assert {split_of(d.title) for d in world.documents} == {split}


def test_every_question_is_answerable_from_its_own_corpus(worlds) -> None:
    for world in worlds.values():
        by_id = world.by_id
        for q in world.questions:
            docs = [by_id[i] for i in q.support]  # KeyError: a support document outside the split
            assert len(docs) == q.hops
            assert _mentions(docs[-1].text, q.answer), q
            if q.hops == 2:  # the first document names the bridge but not the answer: two retrievals
                assert docs[1].title in docs[0].text, q
                assert not _mentions(docs[0].text, q.answer), q
                assert docs[1].title not in q.question, q


def test_bm25_finds_the_supporting_documents(worlds, test_files) -> None:
    index = open_index(test_files.corpus)
    world = worlds["test"]
    for q in world.questions[:150]:
        assert q.support[0] in [d.id for d in index.search(q.question, 3)], q
        if q.hops == 2:
            bridge = world.by_id[q.support[1]].title
            assert index.search(bridge, 1)[0].id == q.support[1], q


def test_written_split(test_files) -> None:
    tasks = [json.loads(line) for line in test_files.tasks.read_text().splitlines()]
    assert len(tasks) == DEFAULT_QUESTIONS["test"] == test_files.questions
    assert {t["hops"] for t in tasks[:2]} == {1, 2}  # alternating 1-hop and 2-hop
    assert {t["corpus"] for t in tasks} == {str(test_files.corpus.resolve())}
    corpus_ids = {json.loads(line)["id"] for line in test_files.corpus.read_text().splitlines()}
    assert all(set(t["support"]) <= corpus_ids for t in tasks)
    assert test_files.index == index_path(test_files.corpus) and test_files.index.is_file()


@pytest.mark.parametrize(
    "reply, gold, em, f1",
    [
        ("<answer>Mermere</answer>", "Mermere", 1.0, 1.0),
        ("The answer is <answer>the Farrow Isles.</answer>", "Farrow Isles", 1.0, 1.0),  # article, punctuation
        ("<answer>1853</answer>", "1853", 1.0, 1.0),
        ("<answer>Farrow</answer>", "Farrow Isles", 0.0, 2 / 3),
        ("<answer>Tainholm</answer>", "Mermere", 0.0, 0.0),
        ("Mermere", "Mermere", 1.0, 1.0),  # no tags: the whole reply
        ("It is Mermere.", "Mermere", 0.0, 0.5),  # precision 1/3, recall 1
        ("<answer>1852</answer><answer>1853</answer>", "1853", 1.0, 1.0),  # the last answer counts
        ("", "Mermere", 0.0, 0.0),
        (None, "Mermere", 0.0, 0.0),
    ],
)
def test_reward_on_hand_made_answers(reply, gold, em, f1) -> None:
    score = score_reply(reply, gold)
    assert score.em == em and score.f1 == pytest.approx(f1)
    assert score.as_reward() == {"em": em, "f1": pytest.approx(f1)}


def test_normaliser_pieces() -> None:
    assert normalize_answer("  The  Grerserk-Bank, an  A.B. ") == "grerserkbank ab"
    assert exact_match("a Bank", "bank") == 1.0 and token_f1("x y", "") == 0.0
    assert extract_answer("<ANSWER> 12 </answer>") == "12"


@pytest.mark.parametrize(
    "query, message",
    [
        ("", "empty query"),
        ("   ?!  ", "empty query"),
        ("x" * (MAX_QUERY_CHARS + 1), "query too long"),
        (" ".join(["word"] * 40 + [f"w{i}" for i in range(40)]), "query too long"),
        (None, "must be text"),
    ],
)
def test_search_tool_refuses_bad_queries_with_a_message(test_files, query, message) -> None:
    index = open_index(test_files.corpus)
    with pytest.raises(QueryError, match=message):
        index.search(query)
    reply = run_search(index, query)
    assert reply.startswith("Error: ") and message in reply


def test_search_tool_survives_fts5_syntax_and_bad_k(test_files) -> None:
    index = open_index(test_files.corpus)
    for query in ['"unbalanced', "title:x AND (y", "NEAR(a b) * -c", "Mermere OR", "ünïcødé"]:
        assert isinstance(run_search(index, query), str)
    assert run_search(index, "zzzzqqq") == "No documents match this query."
    with pytest.raises(QueryError, match="k must be"):
        index.search("town", 0)
    assert len(index.search("town", 10)) == 10


def test_index_is_built_once_and_rebuilt_when_the_corpus_changes(tmp_path: Path) -> None:
    files = write_split(tmp_path, "val", seed=0, questions=4)
    built = files.index.stat().st_mtime_ns
    open_index(files.corpus)
    assert files.index.stat().st_mtime_ns == built  # up to date: not rebuilt
    doc = {"id": "extra", "title": "Quibblewick", "text": "Quibblewick is a town."}
    with files.corpus.open("a") as f:
        f.write(json.dumps(doc) + "\n")
    os.utime(files.corpus, ns=(built + 10**9, built + 10**9))
    assert open_index(files.corpus).search("Quibblewick", 1)[0].id == "extra"


def test_bad_corpus_files(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="does not exist"):
        open_index(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "title": "A", "text": "x"}\n{"id": "b"}\n')
    with pytest.raises(CorpusError, match="bad.jsonl:2"):
        build_index(bad)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="split must be one of"):
        generate_split("dev")
    with pytest.raises(ValueError, match="questions must be at least 1"):
        write_split("/nonexistent", "val", questions=0)


@pytest.mark.parametrize("example", ["rag", "math"])
def test_example_configs_are_valid_grpo_settings(example: str) -> None:
    """`agentgrad train --config examples/<x>/config.yaml` refuses unknown keys: these have none."""
    from agentgrad.algorithms.grpo import GRPOConfig
    from agentgrad.config import resolve

    config = resolve(GRPOConfig, Path(__file__).parents[2] / "examples" / example / "config.yaml")
    assert config.output_dir == f"runs/example-{example}"
    assert config.max_seconds == 900 and config.sampling["max_tokens"] == 64


def test_generate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentgrad.cli import main

    assert (
        main(
            ["scenarios", "rag", "generate", str(tmp_path), "--seed", "3", "--train", "10", "--val", "4", "--test", "6"]
        )
        == 0
    )
    assert "test: 6 tasks over 350 documents" in capsys.readouterr().out
    assert json.loads((tmp_path / "world.json").read_text())["seed"] == 3
    lines = (tmp_path / "train.jsonl").read_text().splitlines()
    assert len(lines) == 10 and json.loads(lines[0])["id"] == generate_split("train", 3).questions[0].id
    assert main(["scenarios", "rag", "generate", str(tmp_path / "other"), "--val", "0"]) == 1
    assert "val=0" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()  # refused before anything was written
