"""An arithmetic agent for a real pretrained model: one chat call, no tool, the number alone.

Written as a user of the OpenAI client writes one; AgentGrad appears only as ``@agentgrad.rollout``
and the ``llm`` resource. SmolLM2-135M-Instruct adds and subtracts small numbers, but mostly
answers in prose ("To solve this problem, …") that runs past the token budget before the number:
the habit GRPO removes (examples/smollm2/README.md).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from openai import OpenAI

import agentgrad

SYSTEM = "You are a calculator. Reply with only the final number."
MAX_TOKENS = 16
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_HTTP = httpx.Client(timeout=None)  # one connection pool per process; the rollout's timeout bounds a call


def last_number_is(text: str, answer: float) -> bool:
    """True when the last number written in ``text`` is ``answer``."""
    numbers = NUMBER.findall(text.replace(",", ""))
    return bool(numbers) and abs(float(numbers[-1]) - float(answer)) < 1e-6


@agentgrad.rollout
def arith_agent(task: dict[str, Any], llm: agentgrad.LLM) -> float:
    """1.0 when the reply's last number is the answer, else 0.0."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", http_client=_HTTP, max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}],
        temperature=llm.sampling.get("temperature", 1.0),
        max_tokens=llm.sampling.get("max_tokens", MAX_TOKENS),
    )
    return 1.0 if last_number_is(reply.choices[0].message.content or "", task["answer"]) else 0.0
