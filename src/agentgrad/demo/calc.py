"""The synthetic calculator tool-use task.

One definition shared by the tiny model's warm-up SFT, the RL demo (``examples/calc``) and the
SFT tests, so that what the model was warmed up on is exactly what an agent later asks of it.

The agent loop: ``[system, user question]`` with ``tools=[CALCULATOR_TOOL]`` → the model emits a
``<tool_call>`` for ``calculator`` → the agent runs :func:`run_calculator` and appends a ``tool``
message → the model answers ("The answer is 449."), judged by :func:`check_answer`.

Problems are two-operand integer expressions written either with symbols ("37 * 12") or in words
("37 times 12"): the model must translate and copy the numbers into the tool call and copy the
tool's result into the answer, which a tiny model learns only partially during warm-up.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

SYSTEM_PROMPT = "You are a careful assistant. Use the calculator tool for arithmetic, then state the answer."

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 37 * 12 + 5"}},
            "required": ["expression"],
        },
    },
}

SPLITS = ("train", "val", "test")
_WORDS = {"+": "plus", "-": "minus", "*": "times"}
_SYMBOL_TEMPLATES = ("What is {e}?", "Calculate {e}.", "Compute {e}.", "What do you get for {e}?")
_WORD_TEMPLATES = ("What is {e}?", "Calculate {e}.", "How much is {e}?")


@dataclass(frozen=True)
class Problem:
    """One task: the question the user asks and the number the final answer must contain."""

    question: str
    answer: int | float | str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _split_of(question: str) -> str:
    """Hash-based split membership: disjoint splits whatever seed or count a caller uses."""
    bucket = hashlib.sha256(question.encode()).digest()[0] % 10
    return "train" if bucket < 8 else ("val" if bucket == 8 else "test")


#: Operands per problem and their range. Measured on 2 cores: with these, the warm-up passes
#: ≈ 40% greedy success around step 400 and ≈ 70% by step 600; with 3 operands or numbers up to
#: 99 the 0.9M-parameter model had not learned to copy results after 1,500 steps.
N_OPERANDS = 2
MAX_OPERAND = 50


def _sample(rng: random.Random) -> tuple[str, str]:
    """Return (question, expression) for one random problem."""
    ops = [rng.choice("+-*") for _ in range(N_OPERANDS - 1)]
    numbers = [rng.randint(2, MAX_OPERAND) for _ in range(N_OPERANDS)]
    expression = str(numbers[0])
    spoken = str(numbers[0])
    for op, number in zip(ops, numbers[1:], strict=True):
        expression += f" {op} {number}"
        spoken += f" {_WORDS[op]} {number}"
    if rng.random() < 0.5:
        question = rng.choice(_SYMBOL_TEMPLATES).format(e=expression)
    else:
        question = rng.choice(_WORD_TEMPLATES).format(e=spoken)
    return question, expression


def generate_problems(n: int, seed: int, split: str = "train") -> list[dict[str, Any]]:
    """``n`` distinct problems of ``split`` as JSON-able ``{"question", "answer"}`` dicts.

    Deterministic in (n, seed, split); train/val/test never share a question.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"calc:{seed}:{split}")
    seen: set[str] = set()
    problems: list[dict[str, Any]] = []
    while len(problems) < n:
        question, expression = _sample(rng)
        if question in seen or _split_of(question) != split:
            continue
        seen.add(question)
        problems.append(Problem(question, int(run_calculator(expression))).to_dict())
    return problems


_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return cast(int | float, node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Mult) and abs(left) * abs(right) > 1e15:
            raise ValueError("result too large")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError("only numbers, + - * / and parentheses are allowed")


def run_calculator(expression: str) -> str:
    """Evaluate ``expression`` safely (an AST walk, never ``eval``); errors come back as text.

    The result is text because it becomes a ``tool`` message; bad input yields ``"Error: ..."``
    so the policy sees (and can learn from) its own malformed calls.
    """
    if not isinstance(expression, str) or not expression.strip():
        return "Error: empty expression"
    if len(expression) > 200:
        return "Error: expression too long"
    try:
        value = _eval(ast.parse(expression.strip(), mode="eval"))
    except ZeroDivisionError:
        return "Error: division by zero"
    except (SyntaxError, ValueError, TypeError, RecursionError) as exc:
        return f"Error: {exc}" if isinstance(exc, ValueError) else "Error: invalid expression"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    return str(value)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def check_answer(final_text: str, answer: int | float | str) -> bool:
    """True when the last number in ``final_text`` equals ``answer`` (within 1e-6)."""
    if not isinstance(final_text, str):
        return False
    numbers = _NUMBER.findall(final_text.replace(",", ""))
    if not numbers:
        return False
    try:
        return abs(float(numbers[-1]) - float(answer)) < 1e-6
    except (TypeError, ValueError):
        return False


def tool_call_text(expression: str) -> str:
    """The assistant turn that calls the calculator, exactly as the chat template renders it."""
    arguments = json.dumps({"expression": expression})
    return '<tool_call>\n{"name": "calculator", "arguments": ' + arguments + "}\n</tool_call>"


def prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """The calculator agent's first prompt for ``question`` as the engine receives it: the system
    turn and the question with the calculator tool, rendered by ``tokenizer``'s chat template."""
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}],
        tools=[CALCULATOR_TOOL],
        add_generation_prompt=True,
        tokenize=False,
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def final_answer_text(answer: int | float | str) -> str:
    """The assistant's final turn in the warm-up data."""
    return f"The answer is {answer}."


def in_words(question: str) -> bool:
    """True when the question spells its operator ("37 times 12") rather than writing it."""
    return any(f" {word} " in question for word in _WORDS.values())


def expression_of(question: str) -> str:
    """The calculator expression a correct policy writes for ``question`` (words → symbols)."""
    body = re.sub(r"^(What is|Calculate|Compute|What do you get for|How much is) ", "", question)
    body = body.rstrip("?.")
    for symbol, word in _WORDS.items():
        body = body.replace(f" {word} ", f" {symbol} ")
    return body
