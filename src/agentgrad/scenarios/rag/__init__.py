"""The RAG scenario: a generated encyclopedia, 1- and 2-hop questions, a BM25 search tool, EM/F1.

Offline stand-in for the reference's MuSiQue-over-Wikipedia setup (docs/scenarios.md): ``world``
generates the entities, documents and questions of each split; ``search`` indexes a corpus file
with SQLite FTS5 and ranks by BM25; ``reward`` scores a reply (SQuAD normalisation, exact match
and token F1); ``files`` writes a split's corpus and tasks; ``prompt`` is what the agent is told.
The agent itself is ``examples/rag``. Importing this package is light (standard library only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.scenarios.rag.files import write_split as write_split
    from agentgrad.scenarios.rag.files import write_world as write_world
    from agentgrad.scenarios.rag.prompt import INSTRUCTIONS as INSTRUCTIONS
    from agentgrad.scenarios.rag.prompt import SEARCH_DESCRIPTION as SEARCH_DESCRIPTION
    from agentgrad.scenarios.rag.reward import score_reply as score_reply
    from agentgrad.scenarios.rag.search import open_index as open_index
    from agentgrad.scenarios.rag.search import run_search as run_search
    from agentgrad.scenarios.rag.world import generate_split as generate_split

_EXPORTS = {
    "write_split": "agentgrad.scenarios.rag.files",
    "write_world": "agentgrad.scenarios.rag.files",
    "INSTRUCTIONS": "agentgrad.scenarios.rag.prompt",
    "SEARCH_DESCRIPTION": "agentgrad.scenarios.rag.prompt",
    "score_reply": "agentgrad.scenarios.rag.reward",
    "open_index": "agentgrad.scenarios.rag.search",
    "run_search": "agentgrad.scenarios.rag.search",
    "generate_split": "agentgrad.scenarios.rag.world",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
