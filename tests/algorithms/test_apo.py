"""APO through the real rollout path (store + runner) with a stand-in critic/editor server.

The agent is deterministic and its reward truly depends on the prompt: it applies a rule to a
word only when the prompt contains that rule's instruction. The stand-in critic reads the traces
and rewards APO sends it and names the instructions missing for the failing task kinds; the
stand-in editor appends one of them. So the score can only rise if APO's whole loop works:
rollouts → traces → critique → edit → publish → validation rollouts → beam.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from stand_in_llm import StandInChatServer

from agentgrad import emit_message
from agentgrad.agents import rollout
from agentgrad.algorithms.apo import APO, APOError, ChatEndpoint, critique_group, val_group
from agentgrad.algorithms.templates import TemplateError, validate_template
from agentgrad.store.memory import MemoryStore
from agentgrad.store.protocol import RolloutFilter
from agentgrad.store.sqlite import SqliteStore
from agentgrad.trainer import Trainer
from agentgrad.types import PromptTemplate

INSTRUCTIONS = {
    "upper": "For upper tasks, answer in uppercase.",
    "reverse": "For reverse tasks, spell the word backwards.",
}
SEED = "Task ({kind}): {word}"
WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "piano", "lemon"]
TASKS = [{"word": w, "kind": k} for w in WORDS for k in ("upper", "reverse")]


def simulated_model(prompt: str, kind: str, word: str) -> str:
    """Follows an instruction only if the prompt states it; otherwise echoes the word."""
    if kind == "upper" and "uppercase" in prompt:
        return word.upper()
    if kind == "reverse" and "backwards" in prompt:
        return word[::-1]
    return word


@rollout
def word_agent(task: dict[str, Any], prompt_template: PromptTemplate) -> float:
    prompt = prompt_template.format(**task)
    answer = simulated_model(prompt, task["kind"], task["word"])
    emit_message(f"prompt: {prompt!r} → answer: {answer!r}")
    expected = task["word"].upper() if task["kind"] == "upper" else task["word"][::-1]
    return float(answer == expected)


def critic_script(messages: list[dict[str, Any]]) -> str:
    """Names the instruction each failing task kind needs, reading APO's rendered runs."""
    user = messages[-1]["content"]
    prompt = re.search(r"<prompt>\n(.*?)\n</prompt>", user, re.DOTALL).group(1)
    failing = re.findall(r"reward 0\nTask: \{[^}]*\"kind\": \"(\w+)\"", user)
    missing = [k for k in INSTRUCTIONS if k in failing and INSTRUCTIONS[k] not in prompt]
    return "\n".join(f"Runs of kind {k!r} fail. Add: {INSTRUCTIONS[k]}" for k in missing) or "Looks fine."


class EditorScript:
    """Appends one of the critique's "Add:" instructions, cycling between calls."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        user = messages[-1]["content"]
        prompt = re.search(r"<prompt>\n(.*?)\n</prompt>", user, re.DOTALL).group(1)
        adds = re.findall(r"Add: (.*)", user)
        self.count += 1
        if not adds:
            return f"<prompt>\n{prompt}\n</prompt>"
        return f"Here you go:\n<prompt>\n{prompt}\n{adds[self.count % len(adds)]}\n</prompt>"


def endpoint(server: StandInChatServer, model: str) -> ChatEndpoint:
    return ChatEndpoint(base_url=server.base_url, model=model, api_key="test", retries=0, concurrency=2)


def make_apo(server: StandInChatServer, **options: Any) -> APO:
    defaults = dict(
        prompt_name="prompt_template",
        beam_width=2,
        branch_factor=2,
        rounds=2,
        train_batch_size=6,
        val_batch_size=8,
        wait_timeout=60,
    )
    return APO(endpoint(server, "critic"), endpoint(server, "editor"), **{**defaults, **options})


def test_apo_raises_validation_score_through_store_and_runner() -> None:
    with StandInChatServer({"critic": critic_script, "editor": EditorScript()}) as server:
        store = MemoryStore()
        trainer = Trainer(store, algorithm=make_apo(server))
        result = trainer.fit(word_agent, TASKS, TASKS, resources={"prompt_template": PromptTemplate(template=SEED)})
        assert result.seed.score == 0.0
        assert result.best.score == 1.0, [(c.template.template, c.score) for c in result.candidates]
        assert all(k in result.best.template.template for k in INSTRUCTIONS.values())
        assert trainer.algorithm.best_prompt() == result.best.template
        # Every candidate is a stored snapshot with lineage; every score is backed by val rollouts.
        for candidate in result.candidates:
            snapshot = store.get_resources(candidate.resources_id)
            assert snapshot.items["apo"].value["round"] == candidate.round
            val = store.query_rollouts(RolloutFilter(group_id=val_group("apo", candidate.resources_id)))
            assert len(val) == 8 and all(r.mode == "val" for r in val)
        child = next(c for c in result.candidates if c.round == 1)
        assert "Add:" in child.critique
        # The winner is the latest snapshot, so agents started later use it.
        assert store.get_latest_resources().items["prompt_template"] == result.best.template
        rounds = store.query_metrics("apo:apo")
        assert [m.step for m in rounds] == [1, 2] and rounds[-1].values["best_score"] == 1.0
        assert server.calls("critic") == 1 + 2  # round 1: the seed; round 2: the two children
        store.close()


def test_apo_works_with_jinja_templates() -> None:
    seed = PromptTemplate(template="Task ({{ kind }}): {{ word }}", engine="jinja")
    with StandInChatServer({"critic": critic_script, "editor": EditorScript()}) as server:
        store = MemoryStore()
        result = Trainer(store, algorithm=make_apo(server)).fit(
            word_agent, TASKS, TASKS, resources={"prompt_template": seed}
        )
        assert result.best.score == 1.0
        assert result.best.template.engine == "jinja"
        store.close()


def test_apo_resumes_after_a_crash(tmp_path) -> None:
    path = tmp_path / "apo.db"
    resources = {"prompt_template": PromptTemplate(template=SEED)}
    editor = EditorScript()

    def crashing_editor(messages: list[dict[str, Any]]) -> str | int:
        # Round 1 makes two edits; the first edit of round 2 "crashes" the run (HTTP 400 is final).
        return 400 if editor.count >= 2 else editor(messages)

    with StandInChatServer({"critic": critic_script, "editor": crashing_editor}) as server:
        store = SqliteStore(path)
        with pytest.raises(APOError, match="refused the request"):
            Trainer(store, algorithm=make_apo(server)).fit(word_agent, TASKS, TASKS, resources=resources)
        store.close()
        critic_calls_before = server.calls("critic")

    with StandInChatServer({"critic": critic_script, "editor": EditorScript()}) as server:
        store = SqliteStore(path)
        apo = make_apo(server)
        assert apo.best_prompt(store).template != SEED  # the round-1 winner is already readable
        result = Trainer(store, algorithm=apo).fit(word_agent, TASKS, TASKS, resources=resources)
        assert result.best.score == 1.0
        # Nothing already done was redone: round-2 critiques were stored before the crash, and
        # round-1 candidates kept their single validation batch.
        assert server.calls("critic") == 0 and critic_calls_before == 3
        for candidate in result.candidates:
            if candidate.round <= 1:
                val = store.query_rollouts(RolloutFilter(group_id=val_group("apo", candidate.resources_id)))
                assert len(val) == 8
        assert len({c.resources_id for c in result.candidates}) == len(result.candidates)
        store.close()


def test_bad_critic_and_editor_replies_are_skipped_not_adopted() -> None:
    useful = "Runs of kind 'upper' fail. Add: " + INSTRUCTIONS["upper"]
    critic_replies = iter(["   ", useful, useful])
    editor_replies = iter(
        [
            "I would rather not.",  # no <prompt> block
            "<prompt>\nTask ({kind}): {word} {secret}\n</prompt>",  # unknown variable
            "<prompt>\nJust answer.\n</prompt>",  # drops {word}, {kind}
            f"<prompt>\n{SEED}\n{INSTRUCTIONS['upper']}\n</prompt>",  # usable
        ]
    )
    with StandInChatServer(
        {"critic": lambda m: next(critic_replies), "editor": lambda m: next(editor_replies)}
    ) as server:
        store = MemoryStore()
        apo = make_apo(server, beam_width=1, rounds=3)
        result = Trainer(store, algorithm=apo).fit(
            word_agent, TASKS, TASKS, resources={"prompt_template": PromptTemplate(template=SEED)}
        )
    templates = [c.template.template for c in result.candidates]
    assert templates == [SEED, f"{SEED}\n{INSTRUCTIONS['upper']}"]
    assert 0.0 < result.best.score < 1.0  # the upper-case tasks of the validation batch now pass
    assert [r["rejected_replies"] for r in result.rounds] == [1.0, 2.0, 1.0]
    # The refusals are recorded on the rollouts the critic read, with the reason.
    seed_id = result.seed.resources_id
    round1 = store.query_rollouts(RolloutFilter(group_id=critique_group("apo", 1, seed_id)))
    assert round1[0].metadata["apo_rejected"][0]["reason"] == "empty critique"
    round2 = store.query_rollouts(RolloutFilter(group_id=critique_group("apo", 2, seed_id)))
    reasons = sorted(e["reason"] for e in round2[0].metadata["apo_rejected"])
    assert reasons[0].startswith("no <prompt>") and "['secret']" in reasons[1]
    store.close()


def test_templates_with_missing_variables_are_refused_naming_them() -> None:
    with pytest.raises(TemplateError, match=r"\['answer', 'hint'\]") as info:
        validate_template(PromptTemplate(template="{word} {hint} {answer.text}"), {"word"})
    assert info.value.missing == ["answer", "hint"]
    with pytest.raises(TemplateError, match=r"\['hint'\]"):
        validate_template(PromptTemplate(template="{{ word }} {{ hint }}", engine="jinja"), {"word"})
    assert PromptTemplate(
        template="{% for x in items %}{{ x }}{% endfor %}", engine="jinja"
    ).referenced_variables() == {"items"}
    with pytest.raises(TemplateError, match="positional"):
        PromptTemplate(template="{} and {0}").referenced_variables()
    with pytest.raises(TemplateError, match="does not parse"):
        PromptTemplate(template="{word").referenced_variables()
    # APO refuses to start from a seed that reads variables the agent does not supply.
    with StandInChatServer({"critic": critic_script, "editor": EditorScript()}) as server:
        store = MemoryStore()
        apo = make_apo(server, variables={"word", "kind"})
        with pytest.raises(TemplateError, match=r"\['difficulty'\]"):
            Trainer(store, algorithm=apo).fit(
                word_agent, TASKS, TASKS, resources={"prompt_template": PromptTemplate(template=SEED + " {difficulty}")}
            )
        assert not any("apo" in r.items for r in store.query_resources())
        store.close()
