"""A review-classification agent whose prompt APO optimizes.

The prompt template is a resource (``prompt_template``), so APO can publish new versions of it
without touching this code; the model behind ``llm`` is any OpenAI-compatible endpoint. The
reward is strict on purpose: only the bare label counts, so a vague prompt ("Classify this
review") loses points that a precise one ("Answer with exactly one word: positive or negative")
wins — which is what the critic will notice in the traces.
"""

from __future__ import annotations

from typing import Any

from openai import OpenAI

import agentgrad
from agentgrad.types import LLM, PromptTemplate, Resources

SEED_PROMPT = "Classify the sentiment of this review: {review}"


@agentgrad.rollout
def review_agent(task: dict[str, Any], resources: Resources) -> float:
    """1.0 when the model's whole reply is the right label, else 0.0."""
    template = resources.get("prompt_template")
    llm = resources.get("llm")
    assert isinstance(template, PromptTemplate) and isinstance(llm, LLM)
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "not-needed", max_retries=2, timeout=60)
    response = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": template.format(review=task["review"])}],
        temperature=llm.sampling.get("temperature", 0.0),
        max_tokens=llm.sampling.get("max_tokens", 16),
    )
    answer = (response.choices[0].message.content or "").strip().strip(".").lower()
    agentgrad.emit_message(f"answer: {answer!r} (expected {task['label']!r})")
    return 1.0 if answer == task["label"] else 0.0
