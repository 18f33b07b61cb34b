"""What the RAG agent is told: one home for the instructions and the search tool's description.

The example agent (``examples/rag``) uses these, and a model warmed up for the scenario should be
warmed up on exactly them, as the calculator model is on ``agentgrad.demo.calc.SYSTEM_PROMPT``.
The answer format is the reference's (``<answer>…</answer>``), which
:func:`agentgrad.scenarios.rag.reward.extract_answer` reads.
"""

from __future__ import annotations

INSTRUCTIONS = (
    "Answer the question using the search tool over an encyclopedia. Search for a name to read its "
    "entry; if the entry names another person, place or organisation you need, search for it too. "
    "Reply with the answer only, as <answer>...</answer>."
)

SEARCH_DESCRIPTION = "Search the encyclopedia; returns the best matching entries. Search for a name or a few keywords."
