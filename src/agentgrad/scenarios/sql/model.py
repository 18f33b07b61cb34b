"""The SQL model: a tiny Qwen2 warmed up to play the SQL agent's three roles, with habits RL can cure.

The calculator model's idea (``demo/tiny.py``) carried to text-to-SQL: the model holds the skill,
but some of its choices are wrong in a consistent way that rewards can correct. It is a
0.98M-parameter Qwen2 (the calculator model's shape, with a 4,096-token context) and a 1,500-token
byte-level BPE trained on the SQL world's text, warmed up by SFT on conversations of the three
roles of ``examples/sql``, in exactly its prompts (``scenarios/sql/prompt.py``):

* **writer** — schema and question → the gold query, as ```` ```sql … ``` ````. Its *habits*: on
  the question kinds in :data:`HABITS` it is taught, in ``HABIT_RATE`` of the times it sees one,
  the query with one mistake — the filter left out (``drop_filter``) or the order turned round
  (``flip_order``). Greedy, it makes the mistake on those kinds; sampled, it writes the right query
  often enough for GRPO to find it, as the calculator model sometimes calls its tool;
* **checker** — the query and its result → ``THE QUERY IS CORRECT.``, unless the query failed or
  returned nothing (``THE QUERY IS INCORRECT.``). It reads the result, not the question, so it
  lets the habits through: a weak checker, frozen in training as in the reference;
* **rewriter** — a query that failed (a column under a name the database does not use, a value
  that is not there) → the gold query, with the writer's habits.

The questions come from a world of its own (:data:`WARMUP_WORLD`: another seed and 400 training
databases), so the example's validation and test databases (seed 0) are ones it never saw.

The package ships one build (``scenarios/sql/data/tiny-sql``), copied into the cache on first use;
``agentgrad models build-sql`` builds one from this recipe (17–31 minutes on 2 cores, measured).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentgrad.demo.tiny import greedy_replies, train_tokenizer, write_model
from agentgrad.demo.warmup import Prepared, Recipe, Sample, build_model
from agentgrad.scenarios.sql.prompt import (
    CHECK_PROMPT,
    CORRECT,
    INCORRECT,
    REWRITE_PROMPT,
    WRITE_PROMPT,
    check_request,
    result_text,
    rewrite_request,
    sql_reply,
    write_request,
)
from agentgrad.scenarios.sql.reward import execution_match, run_query
from agentgrad.scenarios.sql.world import WorldConfig, write_world

SQL_MODEL_NAME = "tiny-sql"
BUILD_FORMAT = 2  # bump when the recipe changes, so cached builds are replaced
VOCAB_SIZE = 1500
CONTEXT = 4096
#: The world the warm-up's questions come from: not the example's (seed 0), and many databases,
#: so the model learns to read a schema rather than remember one.
WARMUP_WORLD = WorldConfig(seed=101, train_databases=400, val_databases=10, test_databases=1)
DEFAULT_STEPS = 4000
BATCH_SIZE = 32
PEAK_LR = 1e-3


def drop_filter(query: str) -> str:
    """The query without its WHERE clause (the filter forgotten)."""
    return re.sub(r" WHERE .*?(?= ORDER BY| GROUP BY|$)", "", query)


def flip_order(query: str) -> str:
    """The query sorted the other way (highest and lowest confused)."""
    return re.sub(r"\b(ASC|DESC)\b", lambda m: "ASC" if m[1] == "DESC" else "DESC", query)


#: The writer's habits: the mistake it tends to make on each kind of question (``questions.py``'s
#: ``skill``). Other kinds it writes as well as it can.
HABITS: dict[str, Callable[[str], str]] = {
    "filter": drop_filter,
    "filter_number": drop_filter,
    "count_filter": drop_filter,
    "join_filter": drop_filter,
    "order": flip_order,
    "top1": flip_order,
    "top3": flip_order,
}
#: Share of warm-up replies, on the kinds in ``HABITS``, that carry the habit's mistake.
HABIT_RATE = 0.65
RECIPE = Recipe(
    SQL_MODEL_NAME,
    BUILD_FORMAT,
    BATCH_SIZE,
    PEAK_LR,
    HABIT_RATE,
    shipped=Path(__file__).with_name("data") / SQL_MODEL_NAME,
    what="the SQL model",
)
#: Share of questions that also give a checker conversation, and a rewriter one.
CHECK_SHARE = 0.3
REWRITE_SHARE = 0.3


def ensure_sql_model() -> Path:
    """The SQL model's directory: the cached build, else the shipped one copied there, else one
    built from the recipe."""
    return RECIPE.ensure(build_sql_model)


@dataclass(frozen=True)
class Conversation:
    """One warm-up conversation: the system prompt, the user's message, the model's reply."""

    role: str  # write, check or rewrite
    system: str
    user: str
    reply: str
    #: The reply with the habit's mistake, taught instead of ``reply`` in ``HABIT_RATE`` of the
    #: times the conversation is trained on (drawn anew each time: drawn once, the model learns
    #: which questions have the habit, and on new ones makes the mistake always or never).
    habit: str | None = None


def _replies(task: dict[str, Any]) -> tuple[str, str | None]:
    """The right reply to ``task`` for a writer or rewriter, and the habitual one (None: no habit)."""
    habit = HABITS.get(task["skill"])
    return sql_reply(task["query"]), None if habit is None else sql_reply(habit(task["query"]))


def _habitual(task: dict[str, Any], rng: random.Random) -> str:
    """A query the model writes for ``task``: the gold one, or in ``HABIT_RATE`` its habit's mistake."""
    habit = HABITS.get(task["skill"])
    return habit(task["query"]) if habit is not None and rng.random() < HABIT_RATE else task["query"]


def _broken(task: dict[str, Any], names: set[str], rng: random.Random) -> str | None:
    """The gold query made to fail as a small model's does: a column called by another of its
    usual names (``price`` where the database says ``cost``), or a value misspelt (no rows)."""
    query = task["query"]
    if rng.random() < 0.5:
        literals = re.findall(r"'([^']+)'", query)
        if literals:
            return query.replace(f"'{literals[0]}'", f"'{literals[0].lower()}x'", 1)
    words = [w for w in re.findall(r"\b[a-z_]+\b", query) if w in names]
    if not words:
        return None
    word = rng.choice(words)
    wrong = rng.choice([f"{word}_name", f"{word}s", word.split("_")[0] + "_value"])
    return None if wrong in names else re.sub(rf"\b{word}\b", wrong, query, count=1)


def conversations(tasks: list[dict[str, Any]], seed: int) -> list[Conversation]:
    """The warm-up conversations of ``tasks`` (tasks of a written world: each has ``db_path``)."""
    rng = random.Random(seed)
    names_of: dict[str, set[str]] = {}
    out: list[Conversation] = []
    for task in tasks:
        names = names_of.get(task["db_id"])
        if names is None:
            names = names_of[task["db_id"]] = set(re.findall(r"[a-z_]+", task["schema"]))
        write = WRITE_PROMPT.format(schema=task["schema"])
        out.append(Conversation("write", write, write_request(task["question"]), *_replies(task)))
        broken = _broken(task, names, rng)
        if broken is None:
            continue
        failed = result_text(run_query(task["db_path"], broken))
        if _verdict(failed) != INCORRECT:  # a misspelt value under count(*) still gives a row
            continue
        if rng.random() < CHECK_SHARE:
            if rng.random() < 0.5:
                shown, result = broken, failed
            else:
                shown = _habitual(task, rng)
                result = result_text(run_query(task["db_path"], shown))
            out.append(
                Conversation(
                    "check",
                    CHECK_PROMPT.format(schema=task["schema"]),
                    check_request(task["question"], shown, result),
                    f"{_verdict(result)}.",
                )
            )
        if rng.random() < REWRITE_SHARE:
            out.append(
                Conversation(
                    "rewrite",
                    REWRITE_PROMPT.format(schema=task["schema"]),
                    rewrite_request(task["question"], broken, failed, f"{INCORRECT}."),
                    *_replies(task),
                )
            )
    return out


def _verdict(result: str) -> str:
    """The warm-up checker's rule: a query that failed or returned nothing is incorrect."""
    return INCORRECT if result.startswith("Error") or result == "[]" else CORRECT


def _messages(system: str, user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _encode(tokenizer: Any, items: list[Conversation]) -> list[Sample]:
    """Each conversation's tokens: the prompt as the server renders it, then the reply and
    ``<|im_end|>`` (what the model generates through the agent), with its habitual twin."""
    prompts = [
        tokenizer.apply_chat_template(_messages(c.system, c.user), tokenize=False, add_generation_prompt=True)
        for c in items
    ]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    reply_ids = tokenizer([c.reply for c in items], add_special_tokens=False)["input_ids"]
    habits = [i for i, c in enumerate(items) if c.habit is not None]
    habit_texts = [str(items[i].habit) for i in habits]
    habit_ids = dict(zip(habits, tokenizer(habit_texts, add_special_tokens=False)["input_ids"], strict=True))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def sample(prompt: list[int], reply: list[int]) -> Sample:
        return Sample(prompt + reply + [im_end], [0] * len(prompt) + [1] * (len(reply) + 1))

    out = []
    for i, (prompt, reply) in enumerate(zip(prompt_ids, reply_ids, strict=True)):
        habit = sample(prompt, habit_ids[i]) if i in habit_ids else None
        out.append(replace(sample(prompt, reply), habit=habit))
    return out


def _extract_query(text: str) -> str:
    """The query in a reply (the example agent's rule: the last ```sql block, else the text)."""
    blocks = re.findall(r"```(?:sql)?\s*\n?(.*?)```", text, re.DOTALL | re.IGNORECASE)
    return blocks[-1].strip() if blocks else text.strip()


def evaluate_writer(model: Any, tokenizer: Any, tasks: list[dict[str, Any]], batch_size: int = 32) -> dict[str, float]:
    """Greedy execution match of the writer's first query on ``tasks`` (written, with ``db_path``):
    ``writer_success`` overall, and on the question kinds with a habit and without one. In process, with
    the agent's prompt, so a build reports where RL starts without starting a server."""
    model.eval()
    wins: dict[str, list[float]] = {"habit": [], "other": []}
    for start in range(0, len(tasks), batch_size):
        batch = tasks[start : start + batch_size]
        prompts = [
            tokenizer.apply_chat_template(
                _messages(WRITE_PROMPT.format(schema=t["schema"]), write_request(t["question"])),
                tokenize=False,
                add_generation_prompt=True,
            )
            for t in batch
        ]
        for task, text in zip(batch, greedy_replies(model, tokenizer, prompts, 96), strict=True):
            score = execution_match(_extract_query(text), task["query"], task["db_path"], ordered=task["ordered"])
            wins["habit" if task["skill"] in HABITS else "other"].append(score.reward)
    everything = wins["habit"] + wins["other"]
    return {
        "writer_success": sum(everything) / max(1, len(everything)),
        **{f"writer_success_{kind}": sum(v) / max(1, len(v)) for kind, v in wins.items()},
    }


def build_sql_model(
    output_dir: str | Path | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    threads: int | None = None,
    progress: bool = True,
    eval_every: int = 500,
    world: WorldConfig = WARMUP_WORLD,
) -> Path:
    """Build the SQL model into ``output_dir`` (default: the cache): the warm-up world written to
    a temporary directory, the tokenizer trained on its conversations, ``steps`` steps of SFT
    (``demo/warmup.py``: AdamW at ``PEAK_LR``, cosine decay to a tenth), greedy writer
    success on the warm-up world's validation databases every ``eval_every`` steps and at the end
    (recorded in ``agentgrad_build.json``). Written atomically, like the calculator model."""
    out = Path(output_dir) if output_dir is not None else RECIPE.default_dir()

    def prepare(data_dir: Path, build_dir: Path) -> Prepared:
        written = write_world(data_dir, world)
        items = conversations(written.tasks["train"], seed)
        texts = [f"{c.system}\n{c.user}\n{c.reply}" for c in items[:4000]]
        tokenizer = train_tokenizer(texts, build_dir, vocab_size=VOCAB_SIZE, model_max_length=CONTEXT)
        model = write_model(build_dir, tokenizer, seed, max_position_embeddings=CONTEXT)
        return Prepared(
            model,
            tokenizer,
            _encode(tokenizer, items),
            lambda: evaluate_writer(model, tokenizer, written.tasks["val"]),
            {
                "conversations": {role: sum(c.role == role for c in items) for role in ("write", "check", "rewrite")},
                "habits": {kind: habit.__name__ for kind, habit in HABITS.items()},
            },
        )

    return build_model(
        out, RECIPE, prepare, steps=steps, seed=seed, threads=threads, progress=progress, eval_every=eval_every
    )
