"""The RAG model: a tiny Qwen2 warmed up to search the encyclopedia as ``examples/rag``'s agent
does, with a habit RL can cure — on 2-hop questions it answers before the second search.

The calculator and SQL models' idea (``demo/tiny.py``, ``scenarios/sql/model.py``) carried to
retrieval. A 4-layer, hidden-128 Qwen2 with a 4,096-token context and a 400-token byte-level BPE
trained on the conversations' templates without their names (:func:`tokenizer_text`), taught by
two drills (``demo/warmup.py``'s skill phases) to copy a name — the question's into its first
search (:func:`first_search`), then, after the first result, the attribute asked for into the
answer or the bridge entity into a second search (:func:`second_turn`) — then warmed up by SFT
on whole searcher conversations exactly as the OpenAI Agents SDK sends them to the model (its
system prompt, ``scenarios/rag/prompt.py``, and its rendering of the ``search`` tool,
:data:`SEARCH_TOOL`), with the real search tool's results:

* search for the entity the question names (its title, copied from the question);
* on a 2-hop question, search for the entity its entry names (copied from the result), then
  answer; on a 1-hop question, answer — ``<answer>…</answer>``, copied from the entry;
* the *habit*: on 2-hop questions, in ``HABIT_RATE`` of the times such a conversation is trained
  on, the model answers right after the first search with the name the first entry gives (the
  town, not its country). Greedy, it does so; sampled, it searches again often enough for GRPO.

A last drill, the reading drill (:data:`READING_STEPS`), trains the answer alone, given every
search: the warm-up trains the answer after a second search too rarely for a cured habit to pay.

The questions come from encyclopedias of other seeds (from :data:`WARMUP_SEED`), whose entities
are all train-split entities (a name's split is a hash of the name), so the example's validation
and test entities are new to it. Names are written after a space (:func:`copied`), so that a copy
is token for token, and every token after the shared system turn is trained on (:func:`dense`),
so that the model sees many copies. The package ships a build (``data/tiny-rag``, installed by
``--model tiny-rag``); its figures are in docs/models.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentgrad.demo.tiny import greedy_replies, train_tokenizer, write_model
from agentgrad.demo.warmup import Prepared, Recipe, Sample, Skill, build_model, shared_prefix, without_prefix
from agentgrad.scenarios.rag.files import balanced, write_split
from agentgrad.scenarios.rag.prompt import INSTRUCTIONS, SEARCH_DESCRIPTION
from agentgrad.scenarios.rag.reward import score_reply
from agentgrad.scenarios.rag.search import SearchIndex, open_index, run_search
from agentgrad.scenarios.rag.world import Question, Split, generate_split

RAG_MODEL_NAME = "tiny-rag"
BUILD_FORMAT = 6  # bump when the recipe changes, so cached builds are replaced
VOCAB_SIZE = 400
CONTEXT = 4096
#: The encyclopedia the warm-up's questions come from (the example's is seed 0).
WARMUP_SEED = 101
#: Encyclopedias (seeds ``WARMUP_SEED``, ``WARMUP_SEED + 1``…) the warm-up questions are spread over, so
#: that a name is seen in few conversations: a model that meets the same 2,000 names again and
#: again remembers them instead of learning to copy (a one-world build wrote train names for
#: validation questions, greedy exact match 0.00 after 1,500 steps).
WARMUP_WORLDS = 20
#: The copy drill (:class:`~agentgrad.demo.warmup.Skill`): the first turn alone (question ->
#: ``search`` for the entity it names) of ``DRILL_PER_WORLD`` questions of each of
#: ``DRILL_WORLDS`` encyclopedias, at a constant learning rate, until ``COPY_THRESHOLD`` of
#: ``PROBE_QUESTIONS`` validation questions are copied exactly (probed every ``PROBE_EVERY``
#: steps), at most ``MAX_DRILL_STEPS``. A drill step is a quarter of a conversation step.
DRILL_WORLDS = 60
DRILL_PER_WORLD = 200
COPY_THRESHOLD = 0.9
PROBE_QUESTIONS = 32
PROBE_EVERY = 250
MAX_DRILL_STEPS = 4000
#: The answer drill, after the copy drill: conversations cut after the first search's result
#: (:func:`second_turn`: a 1-hop question's answer, a 2-hop question's second search) of
#: ``ANSWER_PER_WORLD`` questions of each of ``ANSWER_WORLDS`` encyclopedias (seeds after the
#: warm-up's), until ``ANSWER_THRESHOLD`` of the probe questions' second turns are exactly right,
#: at most ``MAX_ANSWER_STEPS``. Reading an entry and copying the attribute asked for did not
#: form in 800 steps of whole conversations (greedy exact match 0.00); on its own it rose from the
#: first step (docs/models.md).
ANSWER_WORLDS = 20
ANSWER_PER_WORLD = 300
ANSWER_THRESHOLD = 0.85
MAX_ANSWER_STEPS = 5000
#: The reading drill, after the warm-up: the conversations of ``READING_PER_WORLD`` questions of
#: each of ``READING_WORLDS`` encyclopedias (seeds after the copy drill's) with their replies
#: trained and the habit drawn as in the warm-up, and a 2-hop question's answer after the second
#: result once more on its own (:func:`reading_samples`), ``READING_STEPS`` steps from
#: ``READING_LR`` with cosine decay. The warm-up trains the answer after a second search in a third
#: of its 2-hop draws (the habit takes the rest): the format-5 build got it right on 15 % of 2-hop
#: questions given both searches, so a cured habit still answered wrong (docs/models.md).
READING_WORLDS = 20
READING_PER_WORLD = 300
READING_STEPS = 600
READING_LR = 5e-4
WARMUP_QUESTIONS = 6000
VAL_QUESTIONS = 64
DEFAULT_STEPS = 400
BATCH_SIZE = 16
PEAK_LR = 1e-3
#: Share of the times a 2-hop conversation is trained on that it answers after one search.
HABIT_RATE = 0.65
RECIPE = Recipe(
    RAG_MODEL_NAME,
    BUILD_FORMAT,
    BATCH_SIZE,
    PEAK_LR,
    HABIT_RATE,
    shipped=Path(__file__).with_name("data") / RAG_MODEL_NAME,
    what="the RAG model",
)
#: Chat messages, as the agent sends them.
Conversation = list[dict[str, Any]]
#: Model turns the in-process evaluation allows (the agent's ``MAX_TURNS`` less the spare one).
EVAL_TURNS = 3

#: The ``search`` tool as the OpenAI Agents SDK sends it (``function_tool(search,
#: description_override=SEARCH_DESCRIPTION)``, captured from the chat request; the test re-captures it).
SEARCH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search",
        "description": SEARCH_DESCRIPTION,
        "parameters": {
            "properties": {"query": {"title": "Query", "type": "string"}},
            "required": ["query"],
            "title": "search_args",
            "type": "object",
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def ensure_rag_model() -> Path:
    """The RAG model's directory: the cached build, else the shipped one copied there, else one
    built from the recipe."""
    return RECIPE.ensure(build_rag_model)


def copied(name: str) -> str:
    """``name`` as the model writes it in a query or an answer: after a space.

    Qwen2's pre-tokenizer (which transformers rebuilds for any Qwen2 directory) glues the
    character before a word to it, so "Brosfi" after a space (in the question and in every entry),
    after ``"`` (a JSON query) and after ``>`` (an answer tag) are three different token sequences
    (``ĠBros fi`` / ``Br os fi`` / ``>B r os fi``): the model would have to learn a spelling map
    for every name instead of a copy. With the space, the copy is token for token; the search
    tool and the reward ignore it.
    """
    return " " + name


def tool_call_text(query: str) -> str:
    """The assistant turn that calls ``search``, exactly as the chat template renders it."""
    return '<tool_call>\n{"name": "search", "arguments": ' + json.dumps({"query": query}) + "}\n</tool_call>"


def answer_text(answer: str) -> str:
    return f"<answer>{copied(answer)}</answer>"


def _search_call(query: str, call_id: str) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "search", "arguments": {"query": query}}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _search_turns(query: str, index: SearchIndex, call_id: str) -> Conversation:
    return [
        _search_call(query, call_id),
        {"role": "tool", "tool_call_id": call_id, "content": run_search(index, query)},
    ]


def _start(question: Question) -> Conversation:
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": question.question}]


def first_search(question: Question, split: Split) -> Conversation:
    """The question and the searcher's first call, for the entity it names: the copy drill's
    conversation (no result, so no search runs)."""
    return [*_start(question), _search_call(copied(split.by_id[question.support[0]].title), "call_1")]


#: A capitalised word other than a question's first: an entity, river or country name, left out
#: of the tokenizer's training text (:func:`tokenizer_text`).
_NAME = re.compile(r"\b(?!(?:Which|When|Where|What|In|It|How|Who)\b)[A-Z][a-z]+")


def tokenizer_text(text: str) -> str:
    """``text`` without its names, for training the tokenizer: the merges then come from the
    templates' words alone, so a name is spelled in letters and short letter groups — a closed
    set of tokens each trained on thousands of times, as the calculator model's digits are. A
    model copies those; names in whole-syllable tokens, each seen in a few conversations, it did
    not learn to copy (docs/models.md)."""
    return _NAME.sub("", text)


def _answer(answer: str) -> dict[str, Any]:
    return {"role": "assistant", "content": answer_text(answer)}


def second_turn(question: Question, split: Split, index: SearchIndex) -> Conversation:
    """The searcher's conversation for ``question`` up to its reply after the first search's
    result — a 1-hop question's answer, a 2-hop question's second search (which is not run): the
    answer drill's conversation, and the start of :func:`conversations`."""
    first, *rest = (split.by_id[doc].title for doc in question.support)
    after_first = _start(question) + _search_turns(copied(first), index, "call_1")
    return [*after_first, _search_call(copied(rest[0]), "call_2") if rest else _answer(question.answer)]


def conversations(question: Question, split: Split, index: SearchIndex) -> tuple[Conversation, Conversation | None]:
    """The searcher's conversation for ``question`` (every search, then the answer), and for a
    2-hop question the habitual one (one search, then the first entry's name as the answer)."""
    turn = second_turn(question, split, index)
    if question.hops == 1:
        return turn, None
    bridge = split.by_id[question.support[1]].title
    result = {"role": "tool", "tool_call_id": "call_2", "content": run_search(index, copied(bridge))}
    return [*turn, result, _answer(question.answer)], [*turn[:-1], _answer(bridge)]


def _render(tokenizer: Any, messages: Conversation) -> str:
    return str(tokenizer.apply_chat_template(messages, tools=[SEARCH_TOOL], tokenize=False, add_generation_prompt=True))


def _completion(message: dict[str, Any]) -> str:
    if message.get("tool_calls"):
        return tool_call_text(message["tool_calls"][0]["function"]["arguments"]["query"])
    return str(message["content"])


def encode(tokenizer: Any, messages: Conversation) -> Sample:
    """One conversation's tokens, built turn by turn — each prompt as the server renders it, then
    the reply the model generates and ``<|im_end|>`` — with the replies trained on."""
    return encode_all(tokenizer, [messages])[0]


def encode_all(tokenizer: Any, conversations: Sequence[Conversation]) -> list[Sample]:
    """:func:`encode` of many conversations, their texts tokenized in one batch: a build encodes
    ~40,000 conversations, and a call of the tokenizer per prompt was half of its preparation."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts: list[str] = []
    replies: list[str] = []
    turns: list[int] = []
    for messages in conversations:
        assistant = [turn for turn, message in enumerate(messages) if message["role"] == "assistant"]
        prompts += [_render(tokenizer, messages[:turn]) for turn in assistant]
        replies += [_completion(messages[turn]) for turn in assistant]
        turns.append(len(assistant))
    if not prompts:
        return [Sample([], []) for _ in conversations]
    prompt_ids = iter(tokenizer(prompts, add_special_tokens=False)["input_ids"])
    reply_ids = iter(tokenizer(replies, add_special_tokens=False)["input_ids"])
    samples = []
    for count in turns:
        ids: list[int] = []
        mask: list[int] = []
        for _ in range(count):
            prompt = next(prompt_ids)
            if prompt[: len(ids)] != ids:
                raise AssertionError("chat template re-tokenization is not prefix-stable")
            reply = [*next(reply_ids), im_end]
            mask += [0] * (len(prompt) - len(ids)) + [1] * len(reply)
            ids = prompt + reply
        samples.append(Sample(ids, mask))
    return samples


def last_reply(sample: Sample) -> Sample:
    """``sample`` trained on its last reply alone: the answer, with every search before it context."""
    start = len(sample.mask)
    while start > 0 and sample.mask[start - 1] == 1:
        start -= 1
    return Sample(sample.ids, [0] * start + [1] * (len(sample.ids) - start))


def encode_pairs(tokenizer: Any, pairs: Sequence[tuple[Conversation, Conversation | None]]) -> list[Sample]:
    """Each ``(right, habit)`` pair of :func:`conversations` as one sample with its habitual twin
    (None for a 1-hop question), all tokenized in one batch (:func:`encode_all`)."""
    encoded = encode_all(tokenizer, [right for right, _ in pairs] + [habit for _, habit in pairs if habit is not None])
    twins = iter(encoded[len(pairs) :])
    return [
        replace(sample, habit=None if habit is None else next(twins))
        for sample, (_, habit) in zip(encoded[: len(pairs)], pairs, strict=True)
    ]


def reading_samples(tokenizer: Any, pairs: Sequence[tuple[Conversation, Conversation | None]]) -> list[Sample]:
    """The reading drill's samples of the questions whose :func:`conversations` are ``pairs``: each
    conversation with the replies trained, the habit drawn as in the warm-up (so that the second
    turn of a 2-hop question keeps the warm-up's odds: trained on the answer alone, the model forgot
    its first search, and with the 2-hop second search untrained it stopped searching twice even
    when sampled, 1 % against 27 %, leaving GRPO nothing to compare); and for a 2-hop question the
    answer after the second result once more, alone."""
    samples: list[Sample] = []
    for sample in encode_pairs(tokenizer, pairs):
        samples += [sample] if sample.habit is None else [sample, last_reply(sample)]
    return samples


def dense(sample: Sample) -> Sample:
    """``sample`` trained on every token (the question and the search results too), not only the
    replies. Copying a name the model has never seen is an induction head's job, and a tiny model
    grows one only with many copies to learn from: the replies hold a few (the name in a query or
    an answer), the entries many (each names its entity twice, each result's title repeats the
    query). Trained on replies alone, the model wrote the right form with invented names (greedy
    exact match 0.00-0.02 over 1,500 steps)."""
    habit = None if sample.habit is None else dense(sample.habit)
    return Sample(sample.ids, [1] * len(sample.ids), habit)


def evaluate_searcher(
    model: Any, tokenizer: Any, questions: list[Question], index: SearchIndex, batch_size: int = 16
) -> dict[str, float]:
    """Greedy exact match of the searcher on ``questions``, in process (the agent's loop: up to
    ``EVAL_TURNS`` model turns, each a search or the answer), overall and by hops, and how often a
    2-hop question got its second search."""
    from agentgrad.inference.toolcalls import parse_tool_calls

    model.eval()
    em: dict[int, list[float]] = {1: [], 2: []}
    searches: list[int] = []
    for start in range(0, len(questions), batch_size):
        batch = questions[start : start + batch_size]
        convs = [_start(q) for q in batch]
        finals: list[str | None] = [None] * len(batch)
        for turn in range(EVAL_TURNS):
            live = [i for i, f in enumerate(finals) if f is None]
            if not live:
                break
            prompts = [_render(tokenizer, convs[i]) for i in live]
            for i, text in zip(live, greedy_replies(model, tokenizer, prompts, 64), strict=True):
                _, calls = parse_tool_calls(text)
                if not calls or turn == EVAL_TURNS - 1:
                    finals[i] = text
                    continue
                try:
                    query = str(json.loads(calls[0]["function"]["arguments"]).get("query", ""))
                except (ValueError, AttributeError):
                    query = ""
                convs[i] += _search_turns(query, index, f"call_{turn + 1}")
        for question, conv, final in zip(batch, convs, finals, strict=True):
            em[question.hops].append(score_reply(final, question.answer).em)
            if question.hops == 2:
                searches.append(sum(m["role"] == "tool" for m in conv))
    every = em[1] + em[2]
    return {
        "em": sum(every) / max(1, len(every)),
        "em_1hop": sum(em[1]) / max(1, len(em[1])),
        "em_2hop": sum(em[2]) / max(1, len(em[2])),
        "second_search": sum(n >= 2 for n in searches) / max(1, len(searches)),
    }


def probe_turn(model: Any, tokenizer: Any, conversations: list[Conversation]) -> float:
    """Share of ``conversations`` whose last reply the model writes exactly, greedy, given the
    turns before it: a drill's probe."""
    model.eval()
    got = greedy_replies(model, tokenizer, [_render(tokenizer, c[:-1]) for c in conversations], 48)
    model.train()
    wanted = [_completion(c[-1]) for c in conversations]
    return sum(w in g for w, g in zip(wanted, got, strict=True)) / max(1, len(conversations))


def build_rag_model(
    output_dir: str | Path | None = None,
    *,
    steps: int = DEFAULT_STEPS,
    seed: int = 0,
    threads: int | None = None,
    progress: bool = True,
    eval_every: int = 200,
    questions: int = WARMUP_QUESTIONS,
    worlds: int = WARMUP_WORLDS,
    drill_worlds: int = DRILL_WORLDS,
    drill_steps: int = MAX_DRILL_STEPS,
    answer_worlds: int = ANSWER_WORLDS,
    answer_steps: int = MAX_ANSWER_STEPS,
    reading_worlds: int = READING_WORLDS,
    reading_steps: int = READING_STEPS,
) -> Path:
    """Build the RAG model into ``output_dir`` (default: the cache): the warm-up encyclopedias'
    train splits and the validation split written to a temporary directory, the tokenizer trained
    on their conversations, the copy drill (:data:`DRILL_WORLDS`, at most ``drill_steps``), the
    answer drill (:data:`ANSWER_WORLDS`, at most ``answer_steps``), then ``steps`` steps of SFT on
    whole conversations (``demo/warmup.py``), then the reading drill (:data:`READING_WORLDS`,
    ``reading_steps``), with greedy exact match on ``VAL_QUESTIONS`` validation questions every
    ``eval_every`` steps and at the end (recorded in ``agentgrad_build.json``). ``questions``,
    ``worlds``, ``drill_worlds``, ``answer_worlds``, ``reading_worlds``: warm-up questions, the
    encyclopedias they are spread over, and the drills' (fewer for tests)."""
    out = Path(output_dir) if output_dir is not None else RECIPE.default_dir()

    def prepare(data_dir: Path, build_dir: Path) -> Prepared:
        written: dict[int, tuple[Split, SearchIndex]] = {}
        generated: dict[int, Split] = {}

        def world(world_seed: int) -> tuple[Split, SearchIndex]:
            """The encyclopedia's train split with its search index written (the conversations search it)."""
            if world_seed not in written:
                files = write_split(data_dir / f"world-{world_seed}", "train", world_seed, 1)
                written[world_seed] = files.world, open_index(files.corpus)
            return written[world_seed]

        def split(world_seed: int) -> Split:
            """The encyclopedia's train split alone: the copy drill searches nothing, so writes nothing."""
            if world_seed in written:
                return written[world_seed][0]
            if world_seed not in generated:
                generated[world_seed] = generate_split("train", world_seed)
            return generated[world_seed]

        per_world = -(-questions // worlds)
        pairs = [
            conversations(q, *world(s))
            for s in range(WARMUP_SEED, WARMUP_SEED + worlds)
            for q in balanced(world(s)[0].questions, per_world)
        ][:questions]
        answer_drill = [
            second_turn(q, *world(s))
            for s in range(WARMUP_SEED + worlds, WARMUP_SEED + worlds + answer_worlds)
            for q in balanced(world(s)[0].questions, ANSWER_PER_WORLD)
        ]
        copy_drill = [
            first_search(q, split(s))
            for s in range(WARMUP_SEED, WARMUP_SEED + drill_worlds)
            for q in balanced(split(s).questions, DRILL_PER_WORLD)
        ]
        reading_drill = [
            (q, s)
            for s in range(WARMUP_SEED + drill_worlds, WARMUP_SEED + drill_worlds + reading_worlds)
            for q in balanced(world(s)[0].questions, READING_PER_WORLD)
        ]
        val_files = write_split(data_dir, "val", WARMUP_SEED, VAL_QUESTIONS)
        val, val_index = val_files.world, open_index(val_files.corpus)
        texts = [m["content"] or "" for right, _ in pairs[:3000] for m in right]
        texts += [_completion(m) for right, _ in pairs[:3000] for m in right if m.get("tool_calls")]
        texts = [INSTRUCTIONS, json.dumps(SEARCH_TOOL), *map(tokenizer_text, texts)]
        tokenizer = train_tokenizer(texts, build_dir, vocab_size=VOCAB_SIZE, model_max_length=CONTEXT)
        model = write_model(build_dir, tokenizer, seed, max_position_embeddings=CONTEXT)
        encoded = encode_pairs(tokenizer, pairs)
        # the system turn with the tool is the same in every conversation: run once a step
        length = shared_prefix(encoded)
        val_questions = balanced(val.questions, VAL_QUESTIONS)
        probe_questions = val_questions[:PROBE_QUESTIONS]

        def drill(name: str, convs: list[Conversation], probe: list[Conversation], threshold: float, cap: int) -> Skill:
            samples = [without_prefix(sample, length) for sample in encode_all(tokenizer, convs)]
            return Skill(name, samples, lambda: probe_turn(model, tokenizer, probe), threshold, PROBE_EVERY, cap)

        reading_probe = [conversations(q, val, val_index)[0] for q in probe_questions]
        reading = Skill(
            "reading",
            [
                without_prefix(sample, length)
                for sample in reading_samples(tokenizer, [conversations(q, *world(s)) for q, s in reading_drill])
            ],
            lambda: probe_turn(model, tokenizer, reading_probe),
            None,
            PROBE_EVERY,
            reading_steps,
            peak_lr=READING_LR,
            decay=True,
            habit_rate=HABIT_RATE,
        )

        return Prepared(
            model,
            tokenizer,
            [dense(without_prefix(sample, length)) for sample in encoded],
            lambda: evaluate_searcher(model, tokenizer, val_questions, val_index),
            {
                "questions": len(pairs),
                "worlds": worlds,
                "drill_questions": len(copy_drill),
                "answer_drill_questions": len(answer_drill),
                "reading_drill_questions": len(reading_drill),
            },
            prefix=encoded[0].ids[:length],
            skills=(
                drill("copy", copy_drill, [first_search(q, val) for q in probe_questions], COPY_THRESHOLD, drill_steps),
                drill(
                    "answer",
                    answer_drill,
                    [second_turn(q, val, val_index) for q in probe_questions],
                    ANSWER_THRESHOLD,
                    answer_steps,
                ),
            ),
            finish=(reading,),
        )

    return build_model(
        out, RECIPE, prepare, steps=steps, seed=seed, threads=threads, progress=progress, eval_every=eval_every
    )
