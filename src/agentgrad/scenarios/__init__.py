"""The paper's scenarios as offline worlds the project generates itself (no download).

Each world is deterministic from a seed and split into train / validation / test sets that never
share a database or a document, so a learning claim is always measured on held-out material:

* :mod:`agentgrad.scenarios.sql` — small SQLite databases and text-to-SQL questions with gold SQL,
  scored by execution match (the example agent: ``examples/sql``).

``agentgrad scenarios <world> generate OUT --seed N`` writes a world to disk. Importing this
package is light: nothing heavy loads until a world is generated or scored.
"""
