"""The SQL agent: a LangGraph graph of three roles sharing one chat model (Agent Lightning's SQL agent).

    writer ──> checker ──(CORRECT)──> end
                  │
                  └──(otherwise)──> rewriter ──> checker ... (at most ``max_rewrites`` rewrites)

* ``writer`` writes a SQLite query for the question and runs it with the ``execute_sql`` tool;
* ``checker`` reads the question, the query and its result (or error) and answers ``CORRECT`` or
  says what is wrong;
* ``rewriter`` writes a corrected query from that feedback and runs it.

Nothing here knows about training: it is ordinary LangChain code, with one ``ChatOpenAI`` pointed
wherever the user likes. ``lightning_langchain.instrument(...)`` (in ``train.py``) is the only
addition: during training it routes the model's calls to the rollout's gateway, records each
call's role (the node's name) and turns ``execute_sql`` errors into AIR ``tool_error`` signals on
the writer/rewriter call that wrote the failing query.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, NotRequired, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from sql_data import execution_match, run_query

__all__ = [
    "SQLState",
    "execute_sql",
    "build_graph",
    "extract_sql",
    "writer_messages",
    "checker_messages",
    "rewriter_messages",
    "solve",
]

WRITER_PROMPT = "Write one SQLite query that answers the question. Tables:\n{schema}"
CHECKER_PROMPT = "Check the SQLite query. Reply CORRECT if it answers the question, else say what is wrong."
REWRITER_PROMPT = "Rewrite the SQLite query so that it answers the question. Tables:\n{schema}"


class SQLState(TypedDict):
    question: str
    schema: str
    db_path: str
    query: NotRequired[str]
    result: NotRequired[str]
    feedback: NotRequired[str]
    rewrites: NotRequired[int]


@tool
def execute_sql(query: str, db_path: str) -> str:
    """Run a SQLite query on the database and return up to 20 rows."""
    rows = run_query(db_path, query, max_rows=20)  # sqlite3.Error propagates: the tool fails
    return repr(rows)


def extract_sql(text: str) -> str:
    """The query in a model reply: the ```sql fenced block if any, else the reply's first statement."""
    fenced = re.search(r"```(?:sql)?\s*(.*?)```", text, flags=re.S | re.I)
    body = fenced.group(1) if fenced else text
    return body.strip().split(";")[0].strip()


def writer_messages(state: SQLState) -> list[Any]:
    return [SystemMessage(WRITER_PROMPT.format(schema=state["schema"])), HumanMessage(state["question"])]


def rewriter_messages(state: SQLState) -> list[Any]:
    user = f"Question: {state['question']}\nQuery: {state.get('query', '')}\nFeedback: {state.get('feedback', '')}"
    return [SystemMessage(REWRITER_PROMPT.format(schema=state["schema"])), HumanMessage(user)]


def checker_messages(state: SQLState) -> list[Any]:
    user = f"Question: {state['question']}\nQuery: {state.get('query', '')}\nResult: {state.get('result', '')}"
    return [SystemMessage(CHECKER_PROMPT), HumanMessage(user)]


async def _run(query: str, db_path: str) -> str:
    """Run the query through the tool; a failure becomes the result text the checker reads."""
    try:
        return await execute_sql.ainvoke({"query": query, "db_path": db_path})
    except (sqlite3.Error, ValueError) as exc:
        return f"Error: {exc}"


def _model(model: BaseChatModel, config: RunnableConfig) -> Any:
    """``model``, with the run's ``temperature`` when the caller configured one (``solve`` does).

    Training samples at the trainer's temperature and validation decodes greedily; the model the
    user built has one fixed temperature, so the run passes its own in the graph's config."""
    temperature = (config.get("configurable") or {}).get("temperature")
    return model if temperature is None else model.bind(temperature=temperature)


def build_graph(model: BaseChatModel, *, max_rewrites: int = 1) -> Any:
    """The compiled graph; run it with ``await graph.ainvoke({"question", "schema", "db_path"})``."""

    # Nodes return partial updates of the state, as LangGraph nodes do.
    async def writer(state: SQLState, config: RunnableConfig) -> dict[str, Any]:
        reply = await _model(model, config).ainvoke(writer_messages(state))
        query = extract_sql(reply.text)
        return {"query": query, "result": await _run(query, state["db_path"]), "rewrites": 0}

    async def checker(state: SQLState, config: RunnableConfig) -> dict[str, Any]:
        reply = await _model(model, config).ainvoke(checker_messages(state))
        return {"feedback": reply.text}

    async def rewriter(state: SQLState, config: RunnableConfig) -> dict[str, Any]:
        reply = await _model(model, config).ainvoke(rewriter_messages(state))
        query = extract_sql(reply.text) or state.get("query", "")
        rewrites = state.get("rewrites", 0) + 1
        return {"query": query, "result": await _run(query, state["db_path"]), "rewrites": rewrites}

    def after_check(state: SQLState) -> str:
        done = "CORRECT" in state.get("feedback", "").upper() and not state.get("result", "").startswith("Error")
        return END if done or state.get("rewrites", 0) >= max_rewrites else "rewriter"

    graph = StateGraph(SQLState)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_node("rewriter", rewriter)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_conditional_edges("checker", after_check, ["rewriter", END])
    graph.add_edge("rewriter", "checker")
    return graph.compile()


async def solve(graph: Any, task: dict[str, Any], *, temperature: float | None = None) -> float:
    """Run the graph on one task; reward 1.0 if its final query returns the gold rows (execution match).

    ``temperature`` (e.g. the rollout's ``llm.sampling["temperature"]``) overrides the model's own."""
    state: SQLState = {"question": task["question"], "schema": task["schema"], "db_path": task["db_path"]}
    config: RunnableConfig = {"configurable": {"temperature": temperature}} if temperature is not None else {}
    out: SQLState = await graph.ainvoke(state, config=config)
    return 1.0 if execution_match(task["db_path"], out.get("query"), task["gold_sql"]) else 0.0
