"""A LangGraph SQL agent written for Agent Lightning 0.x, run by AgentGrad.

The same shape as Agent Lightning's ``examples/spider/sql_agent.py``: a graph of four nodes over
one LLM — ``write_query`` → ``execute_query`` → ``check_query`` → (``rewrite_query`` →
``execute_query`` → ``check_query``)… — against a SQLite database, rewarded 1.0 when the final
query returns the same rows as the ground truth. Only the import line differs from an Agent
Lightning agent (``import agentlightning as agl`` works too, through
``agentgrad.compat.install_alias()`` or the ``agentgrad`` command).

The prompts are shorter than Spider's and the databases tiny, so that the project's 0.9M-parameter
test model (1,024 tokens of context) can run it. Train only the writer and the rewriter::

    agl.Trainer(algorithm=agl.VERL(config), adapter={"agent_match": "write|rewrite"}).fit(
        LitSQLAgent(), train_dataset=tasks, val_dataset=val)
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import tempfile
from typing import Any, Literal, TypedDict, cast

from langchain_core.messages import AnyMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

# the one line that differs from Agent Lightning's: import agentlightning as agl
from agentgrad.compat import agentlightning as agl

agl.setup_logging(apply_to=[__name__])
logger = logging.getLogger(__name__)

WRITE_QUERY_PROMPT = (
    "Write one {dialect} query that answers the question. Tables:\n{table_info}\nReply as:\n```sql\nQUERY\n```"
)
CHECK_QUERY_PROMPT = (
    "Check the {dialect} query. Tables:\n{table_info}\nEnd with THE QUERY IS CORRECT. or THE QUERY IS INCORRECT."
)
REWRITE_QUERY_PROMPT = "Rewrite the {dialect} query to fix it. Tables:\n{table_info}\nReply as:\n```sql\nQUERY\n```"


class State(TypedDict, total=False):
    question: str
    query: str
    execution: str
    feedback: str
    num_turns: int
    messages: list[AnyMessage]


class SQLAgent:
    """The LangGraph agent itself: no Agent Lightning in it."""

    def __init__(
        self,
        db_path: str,
        *,
        endpoint: str,
        model: str,
        temperature: float,
        max_tokens: int,
        max_turns: int = 3,
        truncate: int = 200,
    ) -> None:
        self.db_path = db_path
        self.max_turns = max_turns
        self.truncate = truncate
        self.llm = ChatOpenAI(
            model=model,
            base_url=endpoint,
            api_key=os.environ.get("OPENAI_API_KEY", "dummy"),
            temperature=temperature,
            max_tokens=max_tokens,
            max_retries=0,
        )

    def table_info(self) -> str:
        with sqlite3.connect(self.db_path) as db:
            rows = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table'").fetchall()
        return "\n".join(sql for (sql,) in rows)[: self.truncate]

    def invoke_prompt(self, system: str, user: str) -> AnyMessage:
        return self.llm.invoke([SystemMessage(system), HumanMessage(user)])

    @staticmethod
    def parse_query(message: AnyMessage) -> str | None:
        found = re.findall(r"```\w*\n(.*?)\n```", str(message.content), re.DOTALL)
        return found[-1].strip() if found else None

    def write_query(self, state: State) -> State:
        system = WRITE_QUERY_PROMPT.format(dialect="sqlite", table_info=self.table_info())
        result = self.invoke_prompt(system, f"Question: {state['question']}")
        query = self.parse_query(result) or str(result.content)
        return {**state, "query": query, "num_turns": 1, "messages": [result]}

    def execute_query(self, state: State) -> State:
        try:
            with sqlite3.connect(self.db_path) as db:
                execution = repr(db.execute(state["query"]).fetchmany(5))
        except sqlite3.Error as exc:
            execution = f"Error: {exc}"
        return {**state, "execution": execution[: self.truncate]}

    def check_query(self, state: State) -> State:
        system = CHECK_QUERY_PROMPT.format(dialect="sqlite", table_info=self.table_info())
        user = f"Question: {state['question']}\nQuery: {state['query'][: self.truncate]}\nResult: {state['execution']}"
        result = self.invoke_prompt(system, user)
        return {**state, "feedback": str(result.content), "messages": [*state.get("messages", []), result]}

    def rewrite_query(self, state: State) -> State:
        system = REWRITE_QUERY_PROMPT.format(dialect="sqlite", table_info=self.table_info())
        user = (
            f"Question: {state['question']}\nQuery: {state['query'][: self.truncate]}\n"
            f"Feedback: {state['feedback'][: self.truncate]}"
        )
        result = self.invoke_prompt(system, user)
        return {
            **state,
            "query": self.parse_query(result) or state["query"],
            "num_turns": state.get("num_turns", 0) + 1,
            "messages": [result],
        }

    def should_continue(self, state: State) -> Literal["__end__", "rewrite_query"]:
        last = state["messages"][-1] if state.get("messages") else None
        if isinstance(last, BaseMessage) and str(last.content).rfind("THE QUERY IS CORRECT") > str(last.content).rfind(
            "THE QUERY IS INCORRECT"
        ):
            return END
        if state.get("num_turns", 0) >= self.max_turns:
            return END
        return "rewrite_query"

    def graph(self) -> Any:
        builder = StateGraph(State)
        builder.add_node(self.write_query)
        builder.add_node(self.execute_query)
        builder.add_node(self.check_query)
        builder.add_node(self.rewrite_query)
        builder.add_edge(START, "write_query")
        builder.add_edge("write_query", "execute_query")
        builder.add_edge("execute_query", "check_query")
        builder.add_conditional_edges("check_query", self.should_continue)
        builder.add_edge("rewrite_query", "execute_query")
        return builder.compile()


def evaluate_query(query: str, ground_truth: str, db_path: str) -> float:
    """1.0 when both queries return the same rows (in any order), else 0.0."""
    try:
        with sqlite3.connect(db_path) as db:
            got = sorted(map(repr, db.execute(query).fetchall()))
            want = sorted(map(repr, db.execute(ground_truth).fetchall()))
    except sqlite3.Error:
        return 0.0
    return 1.0 if got == want else 0.0


class LitSQLAgent(agl.LitAgent[dict[str, Any]]):
    def __init__(
        self,
        trained_agents: str | None = None,
        val_temperature: float | None = None,
        max_turns: int = 3,
        max_tokens: int = 48,
    ) -> None:
        super().__init__(trained_agents=trained_agents)
        self.val_temperature = val_temperature
        self.data_dir = os.environ.get("SQL_AGENT_DATA_DIR", "data")
        self.max_turns = max_turns
        self.max_tokens = max_tokens

    def rollout(self, task: dict[str, Any], resources: agl.NamedResources, rollout: agl.Rollout) -> float | None:
        llm = cast(agl.LLM, resources["main_llm"])
        original_db_path = os.path.join(self.data_dir, task["db_id"] + ".sqlite")
        if not os.path.exists(original_db_path):
            logger.error("Database %s does not exist. Skipping.", original_db_path)
            return None
        temperature = (
            llm.sampling_parameters.get("temperature", 1.0)
            if rollout.mode == "train"
            else self.val_temperature
            if self.val_temperature is not None
            else llm.sampling_parameters.get("temperature", 0.0)
        )
        with tempfile.TemporaryDirectory() as temp_dir:
            db_path = os.path.join(temp_dir, os.path.basename(original_db_path))
            shutil.copyfile(original_db_path, db_path)
            agent = SQLAgent(
                db_path,
                endpoint=llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id),
                model=llm.model,
                temperature=temperature,
                max_tokens=llm.sampling_parameters.get("max_tokens", self.max_tokens),
                max_turns=self.max_turns,
            ).graph()
            handler = self.tracer.get_langchain_handler()  # required by Agent Lightning; harmless here
            result = agent.invoke(
                {"question": task["question"]},  # type: ignore[arg-type]
                {"callbacks": [handler] if handler else [], "recursion_limit": 100},
            )
            reward = evaluate_query(result["query"], task["query"], db_path)
        logger.info("[Rollout %s] query %r reward %s", rollout.rollout_id, result["query"], reward)
        return reward


def make_database(path: str) -> None:
    """The tiny database the tests and the debug run use (``{data_dir}/shop.sqlite``)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE items (name TEXT, price INTEGER)")
        db.executemany("INSERT INTO items VALUES (?, ?)", [("pen", 2), ("book", 12), ("lamp", 30)])


TASKS = [
    {"db_id": "shop", "question": "How many items are there?", "query": "SELECT count(*) FROM items"},
    {
        "db_id": "shop",
        "question": "What is the price of the book?",
        "query": "SELECT price FROM items WHERE name = 'book'",
    },
    {"db_id": "shop", "question": "Which items cost more than 10?", "query": "SELECT name FROM items WHERE price > 10"},
    {
        "db_id": "shop",
        "question": "What is the cheapest item?",
        "query": "SELECT name FROM items ORDER BY price LIMIT 1",
    },
]


def debug_sql_agent() -> None:
    """Agent Lightning's debug entry: ``Trainer(n_workers=1, initial_resources=...).dev(...)``."""
    trainer = agl.Trainer(
        n_workers=1,
        initial_resources={
            "main_llm": agl.LLM(
                endpoint=os.environ["OPENAI_API_BASE"], model="gpt-4.1-nano", sampling_parameters={"temperature": 0.7}
            )
        },
    )
    trainer.dev(LitSQLAgent(), TASKS)


if __name__ == "__main__":
    debug_sql_agent()
