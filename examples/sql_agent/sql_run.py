"""The SQL agent's tasks, warm start and session under ``module:function`` names, for
``lightning-rl train examples/sql_agent/config.toml``.

What ``train.py`` does with its defaults: 180 templated training questions and 100 held-out ones over
a SQLite database built in the run folder (48 more, the probe questions, only check the warm start),
the staged warm start of the tiny model (skill, then the habit of answering from memory), and the
LangGraph agent with one ``ChatOpenAI``. The session is the part a run file cannot write as values:
``lightning_langchain.instrument(trainable=...)``, then the model client and the graph, built inside
the training's event loop (the session is async) so that the client's own ``httpx.AsyncClient`` is
closed in the loop that used it; then ``uninstrument()``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from lightning_rl.types import Task

__all__ = ["train_tasks", "val_tasks", "warm_start", "session", "sql_agent"]

HERE = Path(__file__).resolve().parent


@functools.cache
def _train_py() -> Any:
    """``train.py`` under its own module name (other examples have a train.py too)."""
    spec = importlib.util.spec_from_file_location("sql_agent_train", HERE / "train.py")
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sql_agent_train", module)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _splits(seed: int, run_dir: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``train.py``'s (training, held-out, probe) questions for ``seed``, over the database it builds
    in the run folder."""
    train_py = _train_py()
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    return train_py._tasks(train_py.parse_args(["--seed", str(seed), "--out", run_dir]), out)


def train_tasks(seed: int = 0, run_dir: str = "runs/sql_agent") -> list[dict[str, Any]]:
    """The training questions of ``train.py`` (its database lands in ``run_dir``)."""
    return _splits(seed, run_dir)[0]


def val_tasks(seed: int = 0, run_dir: str = "runs/sql_agent") -> list[dict[str, Any]]:
    """The held-out questions of ``train.py``."""
    return _splits(seed, run_dir)[1]


def warm_start(
    model: str,
    out_dir: Path,
    tasks: Sequence[Task],
    seed: int,
    expert_steps: int = 1000,
    polish_steps: int = 150,
    habit_steps: int = 200,
) -> Path:
    """``train.py``'s staged warm start on demonstrations of all three roles; its probe questions are
    ``train.py``'s for ``seed`` over the same database (the run folder is where the tasks' database is)."""
    from lightning_rl.trainer.services import resolve_model

    inputs: list[dict[str, Any]] = [t.input for t in tasks]
    run_dir = str(Path(inputs[0]["db_path"]).parent) if inputs else str(Path(out_dir).parent)
    return _train_py().warm_start(
        resolve_model(model),
        Path(out_dir),
        inputs,
        _splits(seed, run_dir)[2],
        seed=seed,
        expert_steps=expert_steps,
        polish_steps=polish_steps,
        habit_steps=habit_steps,
    )


_graph: Any = None
"""The session's graph: one per run, as in ``train.py``."""


@contextlib.asynccontextmanager
async def session(trainable: list[str] | None, config: Any, max_rewrites: int = 1) -> AsyncGenerator[None]:
    """Instrument LangChain, build the model client and the graph, and tear them down after training."""
    global _graph
    import httpx
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr
    from sql_graph import build_graph

    import lightning_langchain

    lightning_langchain.instrument(trainable=trainable if trainable is not None else ["writer", "rewriter"])
    http = httpx.AsyncClient()
    try:
        chat = ChatOpenAI(
            model="sql-writer",
            base_url=os.environ.get("SQL_AGENT_BASE_URL", "http://localhost:8000/v1"),
            api_key=SecretStr(os.environ.get("OPENAI_API_KEY", "EMPTY")),
            max_completion_tokens=config.max_tokens,
            temperature=1.0,
            max_retries=0,
            http_async_client=http,
        )
        _graph = build_graph(chat, max_rewrites=max_rewrites)
        yield
    finally:
        _graph = None
        await http.aclose()
        lightning_langchain.uninstrument()


async def sql_agent(task: dict[str, Any], llm: Any) -> float:
    """One rollout: the session's graph on ``task``, at the run's temperature (greedy in validation)."""
    from sql_graph import solve

    if _graph is None:
        raise RuntimeError(
            "sql_run.sql_agent runs inside its session: add session = 'sql_run:session' to the run file."
        )
    return await solve(_graph, task, temperature=llm.sampling.get("temperature"))
