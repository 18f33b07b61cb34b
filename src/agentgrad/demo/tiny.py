"""The embedded tiny model: a Qwen2-architecture causal LM the project builds itself.

It makes the whole project run — and visibly learn — on a 2-core machine with no downloads:
a byte-level BPE tokenizer trained on the calculator task's text, a Qwen2.5-style chat template
with tools, and a 0.9M-parameter Qwen2 model warmed up by SFT on the calculator task.

The warm-up gives the model a realistic bad habit for RL to cure: many of its conversations
answer straight away ("The answer is 799.") instead of calling the calculator — most of those
whose question spells the operator out ("47 times 17"), a few of the others. The model learns
to use the tool competently but, greedy, skips it for questions in words and guesses badly:
38–48% greedy success overall (it varies with library versions), far better with the tool.
Learning from rewards removes exactly this kind of mistake (see docs/models.md).

The habit must not hang on how an agent framework writes the tool: LangChain, the OpenAI Agents
SDK and AutoGen each send the same calculator as different JSON (key order, titles, ``strict``,
parameter descriptions) under their own system prompts, and a model warmed up on one rendering
ignored the tool under the others. So each warm-up conversation draws its tool schema, system
prompt and description from the renderings those frameworks really send
(``demo/renderings.py``), and the model calls the tool as often under each of them.

The package ships one build of this recipe (``demo/data/tiny-calc``, 3.5 MB): the first use copies
it into the cache in a second instead of building for minutes, and every machine starts from the
same weights. ``agentgrad models build-tiny`` still builds one from the recipe.

The output is an ordinary Hugging Face model directory; it is loaded through
``AutoTokenizer``/``AutoModelForCausalLM`` exactly like a user's own model.
Requires transformers >= 4.51 (tested with 5.x, whose tokenizer class is ``TokenizersBackend``).
"""

from __future__ import annotations

import json
import random
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentgrad.demo import calc
from agentgrad.demo.renderings import (
    DESCRIPTIONS,
    FRAMEWORKS,
    PLAIN,
    SYSTEM_PROMPTS,
    TOOL_SCHEMAS,
    Rendering,
    with_description,
)
from agentgrad.demo.template import CHAT_TEMPLATE
from agentgrad.demo.threads import AdaptiveThreads
from agentgrad.inference.kv_cache import cache_kwargs, prefix_cache
from agentgrad.models.cache import install_lock, models_cache_dir, staged_dir
from agentgrad.training.token_loss import trained_token_loss

TINY_NAME = "tiny-calc"
VOCAB_SIZE = 640
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added (non-special) tokens, as in Qwen2.5: they survive skip_special_tokens decoding, and they
# are pre-tokenization boundaries, which keeps tokenize(a + b) == tokenize(a) + tokenize(b) at
# every turn boundary of the chat template.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# Qwen2's pre-tokenization regex (transformers' ``Qwen2Tokenizer`` applies it on load).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BUILD_FORMAT = 10  # bump when the recipe changes, so cached models are rebuilt
DEFAULT_WARMUP_STEPS = 1300
#: The warm-up's last steps, where the learning rate decays and direct answers are mixed in.
#: Before them the model sees only tool-using conversations at a constant rate: copying numbers
#: into the call and back is an abrupt, fragile skill for a model this small (it appears around
#: step 450–1,450), and mixing direct answers in from the start delayed it past 1,000 steps.
#: 600 steps, not 400: with the framework renderings the skill formed late (step 1,450) and after
#: 400 habit steps the model still called the tool for a third of the spelled-out questions.
DEFAULT_HABIT_STEPS = 600
#: The tool-only phase goes on past ``warmup_steps - habit_steps`` until greedy calls on the
#: validation problems succeed this often (probed every ``SKILL_PROBE_EVERY`` steps), at most
#: ``MAX_EXTRA_TOOL_STEPS`` more: when the skill appears varies with library versions' numerics
#: (one build had it by step 700, another not by 750), and the habit phase needs it formed.
SKILL_THRESHOLD = 0.9
SKILL_PROBE_EVERY = 50
#: How often (steps) a build with ``threads=None`` re-decides its torch thread count.
ADAPT_THREADS_EVERY = 25
MAX_EXTRA_TOOL_STEPS = 800
#: Share of warm-up conversations that answer without the calculator (the habit RL removes),
#: for questions that spell the operator out and for those that write it as a symbol.
DIRECT_ANSWER_RATE = {"words": 0.75, "symbols": 0.25}
#: Share of warm-up conversations in the plain demo's rendering (its tool schema and system
#: prompt); the rest draw a framework's tool schema, a system prompt and a description
#: (:func:`warmup_mix`), so that the model calls its tool however an agent framework writes it.
PLAIN_SHARE = 0.3
#: Share of conversations whose answer turn carries no tools (AutoGen's reflection call).
REFLECTION_SHARE = 0.05
#: Peak learning rate of the warm-up (AdamW). 1e-3, not 3e-3: at 3e-3 whether the tool skill
#: formed depended on the seed (seed 1 of the format-9 recipe never formed it, greedy tool
#: success 0.31 at the end); at 1e-3 seeds 0, 1 and 2 all formed it (by step 1,750, 950 and 700).
WARMUP_PEAK_LR = 1e-3


#: The tiny model's architecture: Qwen2 (the default), or its Qwen3 twin for engines without Qwen2.
Architecture = Literal["qwen2", "qwen3"]


def default_model_dir() -> Path:
    """Where the default tiny model lives: ``$AGENTGRAD_CACHE_DIR/models/tiny-calc``, else
    ``$XDG_CACHE_HOME/agentgrad/models/tiny-calc``, else ``~/.cache/agentgrad/models/tiny-calc``."""
    return models_cache_dir() / TINY_NAME


#: The build the package ships (installed by :func:`ensure_tiny_model` instead of building).
SHIPPED_MODEL_DIR = Path(__file__).with_name("data") / TINY_NAME


def ensure_tiny_model(threads: int | None = None) -> Path:
    """The default tiny model's directory. When it is missing or was built by an older recipe
    (``BUILD_FORMAT`` in ``agentgrad_build.json``), the build the package ships is copied there
    (a second), or, if the package holds none of the current recipe, one is built (≈ 5–11 min on
    2 cores)."""
    path = default_model_dir()
    ensure_built(
        path, SHIPPED_MODEL_DIR, BUILD_FORMAT, lambda out: build_tiny_model(out, threads=threads), "the tiny model"
    )
    return path


def ensure_built(path: Path, shipped: Path, build_format: int, build: Callable[[Path], Any], what: str) -> None:
    """Make ``path`` hold a model of recipe ``build_format``: as it is, else a copy of the
    ``shipped`` build when that one is current, else ``build(path)``.

    Concurrent callers (a build started in the background, a test, a second demo) take turns on
    a lock file beside the model, so one builds and the others wait for it and reuse its result.
    """
    with install_lock(path.with_name(f".{path.name}.lock"), f"building {what}"):
        if _is_current(path, build_format):
            return
        if _is_current(shipped, build_format):
            _install_shipped(shipped, path, what)
        else:
            build(path)


def _install_shipped(shipped: Path, path: Path, what: str) -> None:
    """Copy the shipped build to ``path`` whole or not at all (a copy beside it, then renamed)."""
    with staged_dir(path, label="install") as staging:
        for item in shipped.iterdir():
            shutil.copy2(item, staging / item.name)
    build = json.loads((path / "agentgrad_build.json").read_text())
    scores = ", ".join(
        f"{key.removeprefix('val_greedy_')} {value:.2f}"
        for key, value in build.items()
        if key.startswith("val_greedy_") and isinstance(value, float)
    )
    print(
        f"installed the shipped build of {what} (recipe format {build['format']}; val greedy: {scores}) in {path}",
        flush=True,
    )


def _is_current(path: Path, build_format: int = BUILD_FORMAT) -> bool:
    try:
        return json.loads((path / "agentgrad_build.json").read_text()).get("format") == build_format
    except (OSError, ValueError):
        return False


def _corpus(n: int, seed: int) -> list[str]:
    """Rendered conversations (in the warm-up's renderings, and one without tools) to train the
    tokenizer on."""
    problems = calc.generate_problems(n, seed, "train")
    renderings = [r for r, _ in warmup_mix()]
    texts = []
    for i, p in enumerate(problems):
        rendering = PLAIN if i % 2 else renderings[i // 2 % len(renderings)]
        texts.append(
            _render(
                _conversation(p, calc.expression_of(p["question"]), system=rendering.system), tools=[rendering.tool]
            )
        )
    texts.append(_render([{"role": "user", "content": "Hello! How are you today?"}], tools=None))
    return texts


def _conversation(
    problem: dict[str, Any], expression: str, direct: bool = False, system: str | None = calc.SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """The messages an agent sends in the calculator loop, final answer included (``direct``: the
    model answers at once, without the tool; ``system`` None: no system message)."""
    arguments = json.dumps({"expression": expression})
    question = [{"role": "user", "content": problem["question"]}]
    if system is not None:
        question.insert(0, {"role": "system", "content": system})
    if direct:
        return [*question, {"role": "assistant", "content": calc.final_answer_text(problem["answer"])}]
    return [
        *question,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": json.loads(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": calc.run_calculator(expression)},
        {"role": "assistant", "content": calc.final_answer_text(problem["answer"])},
    ]


def _render(
    messages: list[dict[str, Any]], *, tools: list[dict[Any, Any]] | None, add_generation_prompt: bool = False
) -> str:
    """Render with the chat template through the same jinja environment transformers uses."""
    return _render_many([messages], tools=tools, add_generation_prompt=add_generation_prompt)[0]


def _render_many(
    conversations: list[list[dict[str, Any]]],
    *,
    tools: list[dict[Any, Any]] | None,
    add_generation_prompt: bool = False,
) -> list[str]:
    """``_render`` for many conversations in one call (the tool schema is prepared once)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    schemas: list[dict[Any, Any] | Callable[..., Any]] | None = None if tools is None else [*tools]
    # transformers' annotation says str; it returns one rendering per conversation (and the
    # generation indices).
    rendered, _ = render_jinja_template(  # type: ignore[str-unpack]
        conversations=conversations,
        tools=schemas,
        chat_template=CHAT_TEMPLATE,
        add_generation_prompt=add_generation_prompt,
    )
    return rendered  # type: ignore[return-value]


def build_tokenizer(output_dir: str | Path, *, seed: int = 0) -> Any:
    """Train the calculator model's tokenizer on the task's text and save it (with the chat
    template) to ``output_dir``."""
    return train_tokenizer(_corpus(600, seed), output_dir)


def train_tokenizer(
    texts: list[str],
    output_dir: str | Path,
    *,
    vocab_size: int = VOCAB_SIZE,
    model_max_length: int = MODEL_CONFIG["max_position_embeddings"],
) -> Any:
    """Train a byte-level BPE tokenizer on ``texts`` and save it (with the chat template and the
    tool tokens) to ``output_dir``: the tokenizer of every tiny model the project builds.

    The pipeline is Qwen2's (NFC, Qwen2's pre-tokenization regex, byte-level BPE) because
    transformers 5 rebuilds exactly that pipeline for any ``model_type: qwen2`` directory; it
    also isolates digits, so numbers are copied digit by digit, which a tiny model learns well.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TOOL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=None,
        model_max_length=model_max_length,
    )
    tokenizer.add_tokens(TOOL_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(output_dir))
    return tokenizer


def write_model(
    output_dir: Path, tokenizer: Any, seed: int, architecture: Architecture = "qwen2", **overrides: Any
) -> Any:
    """Create the random-initialised model matching ``tokenizer`` and save it: a Qwen2, or its
    Qwen3 twin (same sizes; for engines that have no Qwen2, such as SkyRL's JAX backend).
    ``overrides``: settings of ``MODEL_CONFIG`` a skill needs otherwise (a longer context)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config_class, model_class, extra = {
        "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
        # Qwen3's head size is its own setting (default 128): the twin keeps Qwen2's hidden / heads
        "qwen3": (
            Qwen3Config,
            Qwen3ForCausalLM,
            {"head_dim": MODEL_CONFIG["hidden_size"] // MODEL_CONFIG["num_attention_heads"]},
        ),
    }[architecture]
    config = config_class(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=pad,
        **{**MODEL_CONFIG, **overrides},
        **extra,
    )
    model = model_class(config)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, pad], pad_token_id=pad)
    model.save_pretrained(str(output_dir))
    return model


def random_tiny_model(output_dir: str | Path, *, seed: int = 0, architecture: Architecture = "qwen2") -> Path:
    """A random-initialised copy of the tiny model (same tokenizer and config), in < 1 s.

    For tests: everything loads and serves like the real one; the outputs are just noise.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out, seed=seed)
    write_model(out, tokenizer, seed, architecture)
    return out


def encode_sample(
    tokenizer: Any, problem: dict[str, Any], direct: bool = False, rendering: Rendering = PLAIN
) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one calculator conversation, rendered by the chat template with
    ``rendering``'s tool and system prompt.

    The sequence is built turn by turn — prompt as the server tokenizes it, then the completion
    the model would generate, ending in ``<|im_end|>`` — so the warm-up teaches exactly the
    token sequences an agent meets through the server.
    """
    return encode_samples(tokenizer, [problem], [direct], rendering)[0]


def encode_samples(
    tokenizer: Any, problems: list[dict[str, Any]], direct: list[bool], rendering: Rendering = PLAIN
) -> list[tuple[list[int], list[int]]]:
    """``encode_sample`` for many conversations: every text is rendered first and tokenized in one
    batch call (parallel in the tokenizers library): 1.45 instead of 2.3 ms a conversation with
    the second core busy, and the build encodes ≈ 30k of them."""
    expressions = [calc.expression_of(p["question"]) for p in problems]
    conversations = [
        _conversation(p, e, d, rendering.system) for p, e, d in zip(problems, expressions, direct, strict=True)
    ]
    turns = [
        (i, turn)
        for i, messages in enumerate(conversations)
        for turn, message in enumerate(messages)
        if message["role"] == "assistant"
    ]
    # AutoGen's reflection call sends no tools: the whole conversation is rendered without them and
    # only its answer turn is trained (the tool call it holds was made with tools, in another prompt)
    tools = [rendering.tool] if rendering.answer_tools else None
    prompts = _render_many([conversations[i][:turn] for i, turn in turns], tools=tools, add_generation_prompt=True)
    completions = [conversations[i][turn]["content"] or calc.tool_call_text(expressions[i]) for i, turn in turns]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    samples: list[tuple[list[int], list[int]]] = [([], []) for _ in problems]
    for (i, turn), prompt, completion in zip(turns, prompt_ids, completion_ids, strict=True):
        ids, mask = samples[i]
        if prompt[: len(ids)] != ids:
            raise AssertionError("chat template re-tokenization is not prefix-stable")
        completion = completion + [im_end]
        new_prompt = prompt[len(ids) :]
        trained = int(rendering.answer_tools or turn == len(conversations[i]) - 1)
        samples[i] = (ids + new_prompt + completion, mask + [0] * len(new_prompt) + [trained] * len(completion))
    return samples


def _system_turn(tokenizer: Any, rendering: Rendering) -> list[int]:
    """The token ids every conversation of ``rendering`` starts with: its system turn (tools
    included when the whole conversation carries them)."""
    messages = [{"role": "user", "content": ""}]
    if rendering.system is not None:
        messages.insert(0, {"role": "system", "content": rendering.system})
    text = _render(messages, tools=[rendering.tool] if rendering.answer_tools else None)
    return tokenizer.encode(text[: text.index("<|im_end|>\n") + len("<|im_end|>\n")], add_special_tokens=False)


@dataclass
class _Pool:
    """One warm-up rendering's conversations, without the system turn they share (``prefix``):
    a step trains on one pool, runs the prefix once and shares its KV cache across the batch
    (≈ 3× faster than padding full sequences)."""

    prefix: list[int]
    #: every conversation using the tool (the tool-only phase)
    with_tool: list[tuple[list[int], list[int]]]
    #: the same problems, some answered without the tool (the habit phase)
    mixed: list[tuple[list[int], list[int]]]
    order: list[int] = field(default_factory=list)

    def batch(self, habit: bool, size: int, rng: random.Random) -> list[tuple[list[int], list[int]]]:
        samples = self.mixed if habit else self.with_tool
        if len(self.order) < size:
            self.order = [i % len(samples) for i in range(max(size, len(samples)))]
            rng.shuffle(self.order)
        return [samples[self.order.pop()] for _ in range(size)]


def _pool(tokenizer: Any, problems: list[dict[str, Any]], direct: list[bool], rendering: Rendering) -> _Pool:
    """Encode ``problems`` with ``rendering`` (``direct``: answered without the tool in the habit
    phase; never for a rendering whose answer turn has no tools, which trains only that turn)."""
    prefix = _system_turn(tokenizer, rendering)
    direct = [d and rendering.answer_tools for d in direct]

    def suffixes(subset: list[dict[str, Any]], answer_directly: bool) -> list[tuple[list[int], list[int]]]:
        if not subset:
            return []
        samples = encode_samples(tokenizer, subset, [answer_directly] * len(subset), rendering)
        if any(ids[: len(prefix)] != prefix for ids, _ in samples):
            raise AssertionError("conversations must start with the shared system turn")
        return [(ids[len(prefix) :], mask[len(prefix) :]) for ids, mask in samples]

    with_tool = suffixes(problems, False)
    answers = iter(suffixes([p for p, d in zip(problems, direct, strict=True) if d], True))
    mixed = [next(answers) if d else sample for d, sample in zip(direct, with_tool, strict=True)]
    return _Pool(prefix, with_tool, mixed)


def warmup_mix() -> list[tuple[Rendering, float]]:
    """The renderings the warm-up draws its conversations from, with their shares: the plain
    demo's (``PLAIN_SHARE``), every combination of a captured framework tool schema, system prompt
    and description (``demo/renderings.py``), and AutoGen's tool-less answer turn under each
    system prompt (``REFLECTION_SHARE``)."""
    combos = [
        Rendering(with_description(tool, description), system)
        for tool in TOOL_SCHEMAS.values()
        for system in SYSTEM_PROMPTS
        for description in DESCRIPTIONS
    ]
    reflections = [Rendering(PLAIN.tool, system, answer_tools=False) for system in SYSTEM_PROMPTS]
    rest = 1.0 - PLAIN_SHARE - REFLECTION_SHARE
    return [
        (PLAIN, PLAIN_SHARE),
        *((r, rest / len(combos)) for r in combos),
        *((r, REFLECTION_SHARE / len(reflections)) for r in reflections),
    ]


def greedy_replies(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int) -> list[str]:
    """The model's greedy reply to each rendered prompt, generated as one batch in process (left
    padding, so every reply starts at the same column); the tokenizer's padding side is restored
    even if generation fails. The builds' evaluations and probes all ask this one question."""
    import torch

    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
    finally:
        tokenizer.padding_side = padding_side
    return list(tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True))


def evaluate_greedy(
    model: Any, tokenizer: Any, problems: list[dict[str, Any]], batch_size: int = 64, rendering: Rendering = PLAIN
) -> dict[str, float]:
    """Greedy behaviour of the calculator loop, run in-process with ``generate``: ``success``
    (task success), ``tool_use`` (share of problems where the model called the calculator) and
    ``tool_success`` (success among those).

    Mirrors what an agent does through the server (same template, same calculator), so the
    build can report what RL will start from without starting a server. ``rendering``: how the
    agent presents the tool (``demo/renderings.py``: each framework's tool schema and system
    prompt; AutoGen's answer turn without tools, or its tool result as the answer).
    """
    from agentgrad.inference.toolcalls import parse_tool_calls

    successes = tool_uses = tool_successes = 0
    model.eval()
    for start in range(0, len(problems), batch_size):
        batch = problems[start : start + batch_size]
        convs = [_conversation(p, "", system=rendering.system)[:-3] for p in batch]
        finals: list[str | None] = [None] * len(batch)
        for turn in range(2):
            live = [i for i, f in enumerate(finals) if f is None and convs[i][-1]["role"] != "assistant"]
            if not live:
                break
            tools = [rendering.tool] if turn == 0 or rendering.answer_tools else None
            texts = _render_many([convs[i] for i in live], tools=tools, add_generation_prompt=True)
            for i, text in zip(live, greedy_replies(model, tokenizer, texts, 48), strict=True):
                content, calls = parse_tool_calls(text) if tools else (text, [])
                if calls:
                    args = calls[0]["function"]["arguments"]
                    try:
                        expression = json.loads(args).get("expression", "")
                    except (ValueError, AttributeError):
                        expression = ""
                    result = calc.run_calculator(str(expression))
                    convs[i].append({"role": "assistant", "content": content, "tool_calls": calls})
                    convs[i].append({"role": "tool", "tool_call_id": calls[0]["id"], "content": result})
                    if rendering.answer_is_tool_result:
                        finals[i] = result
                else:
                    finals[i] = text
        for conv, final, problem in zip(convs, finals, batch, strict=True):
            ok = calc.check_answer(final or "", problem["answer"])
            used_tool = conv[-1]["role"] == "tool"
            successes += ok
            tool_uses += used_tool
            tool_successes += ok and used_tool
    n = max(1, len(problems))
    return {"success": successes / n, "tool_use": tool_uses / n, "tool_success": tool_successes / max(1, tool_uses)}


def _habit_start(
    model: Any,
    tokenizer: Any,
    val: list[dict[str, Any]],
    step: int,
    planned: int,
    progress: bool,
    evaluated: dict[str, float] | None,
) -> int | None:
    """``step`` if the tool-only phase may end there (the skill has formed, or the extension is
    used up), else None: keep training on tool calls and ask again ``SKILL_PROBE_EVERY`` later.
    ``evaluated``: the periodic evaluation of this very step, if there was one."""
    if planned == 0 or step >= planned + MAX_EXTRA_TOOL_STEPS:
        return step
    if (step - planned) % SKILL_PROBE_EVERY:
        return None
    skill = (evaluated or evaluate_greedy(model, tokenizer, val))["tool_success"]
    if skill >= SKILL_THRESHOLD:
        return step
    if progress:
        print(
            f"step {step:4d}  greedy tool calls succeed {skill:.2f} < {SKILL_THRESHOLD}: more tool-only steps",
            flush=True,
        )
    return None


def build_tiny_model(
    output_dir: str | Path | None = None,
    *,
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    seed: int = 0,
    progress: bool = True,
    batch_size: int = 32,
    eval_every: int = 250,
    habit_steps: int = DEFAULT_HABIT_STEPS,
    threads: int | None = None,
    architecture: Architecture = "qwen2",
) -> Path:
    """Build the tiny model with its SFT warm-up into ``output_dir`` (default: the cache dir).

    Trains on ``batch_size`` conversations per step for ``warmup_steps`` steps: tool-using ones
    at a constant learning rate, then, for the last ``habit_steps``, a mix where some answer
    without the tool (``DIRECT_ANSWER_RATE``) while the rate decays to a tenth (cosine). The
    tool-only phase is extended until the calculator skill has formed (``SKILL_THRESHOLD``), so
    the total can exceed ``warmup_steps`` by up to ``MAX_EXTRA_TOOL_STEPS``. Every
    ``eval_every`` steps and at the end it reports greedy behaviour on 128 validation problems
    (also written to ``agentgrad_build.json``). Seeds are fixed, so a build is reproducible on a
    given machine with the same library versions (the thread count does not matter).
    ``threads``: torch threads; None follows the machine's load (``models/threads.py``), which
    lets a build share a small machine with other work. ``architecture="qwen3"`` builds the same
    recipe into the Qwen3 twin (SkyRL's Tinker server has no Qwen2: ``make test-scale``). Written
    atomically: a half-built model never sits in the cache.

    Each step trains on one rendering of the task (:func:`warmup_mix`: the plain demo's, or a
    framework's tool schema, system prompt and description), drawn in proportion to its share, so
    the batch shares one system turn. The manifest also records greedy validation behaviour under
    each framework's rendering (``val_greedy_by_framework``).
    """
    import math

    import torch

    out = Path(output_dir) if output_dir is not None else default_model_dir()
    started = time.monotonic()
    random.seed(seed)
    torch.manual_seed(seed)
    previous_threads = torch.get_num_threads()
    adaptive: AdaptiveThreads | None = None
    if threads is None:
        adaptive = AdaptiveThreads()
        adaptive.decide()
    else:
        torch.set_num_threads(threads)
    try:
        with staged_dir(out, label="build") as tmp:
            tokenizer = build_tokenizer(tmp, seed=seed)
            model = write_model(tmp, tokenizer, seed, architecture)
            pad = tokenizer.pad_token_id
            train = calc.generate_problems(20_000, seed, "train")
            val = calc.generate_problems(128, seed, "val")
            rng = random.Random(seed)
            answers_directly = [
                rng.random() < DIRECT_ANSWER_RATE["words" if calc.in_words(p["question"]) else "symbols"] for p in train
            ]
            mix = warmup_mix()
            drawn = rng.choices(range(len(mix)), weights=[w for _, w in mix], k=len(train))
            pools = []
            for index, (rendering, _) in enumerate(mix):
                members = [i for i, d in enumerate(drawn) if d == index]
                if members:
                    subset, direct = [train[i] for i in members], [answers_directly[i] for i in members]
                    pools.append((len(members), _pool(tokenizer, subset, direct, rendering)))
            optimizer = torch.optim.AdamW(model.parameters(), lr=WARMUP_PEAK_LR, weight_decay=0.01, betas=(0.9, 0.98))
            warmup, tool_steps = 50, max(0, warmup_steps - habit_steps)
            decay_from: int | None = None  # the step the habit phase starts at, once it is decided

            def lr_factor(s: int) -> float:
                progress = 0.0 if decay_from is None else min(1.0, max(0, s - decay_from) / max(1, habit_steps))
                return min(1.0, (s + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))

            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
            step = 0
            report: dict[str, float] = {}
            while decay_from is None or step < decay_from + habit_steps:
                step += 1
                if decay_from is None and step > tool_steps:
                    decay_from = _habit_start(
                        model,
                        tokenizer,
                        val,
                        step - 1,
                        tool_steps,
                        progress,
                        report if (step - 1) % eval_every == 0 else None,
                    )
                model.train()
                # one rendering a step, drawn in proportion to its share of the problems
                pool = rng.choices([p for _, p in pools], weights=[n for n, _ in pools])[0]
                batch = pool.batch(decay_from is not None, batch_size, rng)
                prefix = pool.prefix
                width = max(len(ids) for ids, _ in batch)
                input_ids = torch.full((batch_size, width), pad)
                labels = torch.full((batch_size, width), -100)
                attention = torch.zeros((batch_size, len(prefix) + width), dtype=torch.long)
                attention[:, : len(prefix)] = 1
                for row, (ids, mask) in enumerate(batch):
                    input_ids[row, : len(ids)] = torch.tensor(ids)
                    attention[row, len(prefix) : len(prefix) + len(ids)] = 1
                    labels[row, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
                kv_cache = prefix_cache(model, torch.tensor([prefix]), batch_size)
                loss = trained_token_loss(model, input_ids, labels, attention_mask=attention, **cache_kwargs(kv_cache))
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                schedule.step()
                optimizer.zero_grad(set_to_none=True)
                if step % eval_every == 0 or (decay_from is not None and step == decay_from + habit_steps):
                    report = evaluate_greedy(model, tokenizer, val)
                    if progress:
                        print(
                            f"step {step:4d}  loss {loss.item():.3f}  val greedy: success {report['success']:.2f}, "
                            f"tool use {report['tool_use']:.2f}, success with the tool {report['tool_success']:.2f}  "
                            f"({time.monotonic() - started:.0f}s)",
                            flush=True,
                        )
                elif progress and step % 50 == 0:
                    print(f"step {step:4d}  loss {loss.item():.3f}  ({time.monotonic() - started:.0f}s)", flush=True)
                if adaptive is not None and step % ADAPT_THREADS_EVERY == 0:
                    adaptive.decide()
            by_framework = {
                name: {k: round(v, 3) for k, v in evaluate_greedy(model, tokenizer, val, rendering=r).items()}
                for name, r in FRAMEWORKS.items()
            }
            model.save_pretrained(str(tmp))
            tokenizer.save_pretrained(str(tmp))
            (tmp / "agentgrad_build.json").write_text(
                json.dumps(
                    {
                        "name": TINY_NAME,
                        "format": BUILD_FORMAT,
                        "architecture": architecture,
                        "seed": seed,
                        "steps": step,
                        "tool_steps": decay_from,
                        "habit_steps": habit_steps,
                        "direct_answer_rate": DIRECT_ANSWER_RATE,
                        "plain_share": PLAIN_SHARE,
                        "reflection_share": REFLECTION_SHARE,
                        "renderings": len(mix),
                        **{f"val_greedy_{k}": v for k, v in report.items()},
                        "val_greedy_by_framework": by_framework,
                        "build_seconds": round(time.monotonic() - started, 1),
                    },
                    indent=2,
                )
            )
    finally:
        torch.set_num_threads(previous_threads)
    warn_if_unskilled(report["tool_success"], seed=seed, steps=step)
    return out


def warn_if_unskilled(tool_success: float, *, seed: int, steps: int) -> None:
    """Warn when a build's greedy tool calls succeed less than ``SKILL_THRESHOLD``: the build
    finished, but the calculator skill the demo relies on did not form (it depends on the seed)."""
    if tool_success >= SKILL_THRESHOLD:
        return
    warnings.warn(
        f"tiny model (seed {seed}): greedy tool calls succeed {tool_success:.2f} < {SKILL_THRESHOLD} after "
        f"{steps} steps: the calculator skill did not form, so GRPO has little to build on (a seed-1 build "
        "measured so: 0.19 → 0.37 held-out on the demo, where the shipped build goes to 0.98). "
        "Build again with another --seed.",
        RuntimeWarning,
        stacklevel=3,
    )
