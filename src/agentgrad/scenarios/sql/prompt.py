"""What the SQL agent's three roles are told: one home for the prompts and the result it shows.

The example agent (``examples/sql``) uses these, and the SQL model (``scenarios/sql/model.py``) is
warmed up on exactly them, as the calculator model is on ``agentgrad.demo.calc.SYSTEM_PROMPT`` and
the RAG scenario's on ``scenarios/rag/prompt.py``.
"""

from __future__ import annotations

from agentgrad.scenarios.sql.reward import Execution

WRITE_PROMPT = (
    "You write one SQLite query that answers the question. Tables:\n{schema}\n"
    "Reply with the query only, as:\n```sql\nSELECT ...\n```"
)
CHECK_PROMPT = (
    "You check a SQLite query written for a question. Tables:\n{schema}\n"
    "Look for a wrong table or column, a missing join or filter, a wrong aggregate. "
    "End with THE QUERY IS CORRECT. or THE QUERY IS INCORRECT."
)
REWRITE_PROMPT = (
    "You fix a SQLite query so that it answers the question. Tables:\n{schema}\n"
    "Reply with the fixed query only, as:\n```sql\nSELECT ...\n```"
)
#: The checker's verdicts (the graph reads whichever comes last in its reply).
CORRECT = "THE QUERY IS CORRECT"
INCORRECT = "THE QUERY IS INCORRECT"
#: Characters of a query result shown to the checker (small models have small contexts).
RESULT_CHARS = 200


def result_text(execution: Execution) -> str:
    """A query's result as the checker reads it: its first 5 rows, or the error."""
    text = f"Error: {execution.error}" if execution.rows is None else repr(execution.rows[:5])
    return text[:RESULT_CHARS]


def write_request(question: str) -> str:
    """The writer's user message."""
    return f"Question: {question}"


def check_request(question: str, query: str, result: str) -> str:
    """The checker's user message: the question, the query and what it returned."""
    return f"Question: {question}\nQuery: {query}\nResult: {result}"


def rewrite_request(question: str, query: str, result: str, feedback: str) -> str:
    """The rewriter's user message: the checker's, and the checker's verdict."""
    return f"{check_request(question, query, result)}\nFeedback: {feedback[:RESULT_CHARS]}"


def sql_reply(query: str) -> str:
    """A query written as the prompts ask for it (what the model is warmed up to reply)."""
    return f"```sql\n{query}\n```"
