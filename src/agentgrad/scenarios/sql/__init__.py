"""The text-to-SQL world: generated SQLite databases, graded questions with gold SQL, and the
execution-match reward (Spider's rule), offline and deterministic from a seed.

* ``schemas.py`` — the database designs (shop, school, flights, library, music);
* ``database.py`` — one database: SQL names and rows drawn from a seed, its SQLite file;
* ``questions.py`` — questions of four grades with gold SQL, checked against the database;
* ``world.py`` — the splits (never sharing a database) and the files on disk;
* ``reward.py`` — execution match under a read-only connection, a time budget and a row cap.

The example agent that learns on it is ``examples/sql`` (LangGraph: write, check, rewrite).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgrad._lazy import lazy_exports

if TYPE_CHECKING:
    from agentgrad.scenarios.sql.reward import SQLScore as SQLScore
    from agentgrad.scenarios.sql.reward import execution_match as execution_match
    from agentgrad.scenarios.sql.reward import run_query as run_query
    from agentgrad.scenarios.sql.world import WorldConfig as WorldConfig
    from agentgrad.scenarios.sql.world import generate_world as generate_world
    from agentgrad.scenarios.sql.world import write_world as write_world

_EXPORTS = {
    "SQLScore": "agentgrad.scenarios.sql.reward",
    "execution_match": "agentgrad.scenarios.sql.reward",
    "run_query": "agentgrad.scenarios.sql.reward",
    "WorldConfig": "agentgrad.scenarios.sql.world",
    "generate_world": "agentgrad.scenarios.sql.world",
    "write_world": "agentgrad.scenarios.sql.world",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
