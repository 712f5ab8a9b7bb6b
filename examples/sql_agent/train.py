"""Train the writer and rewriter of the LangGraph SQL agent with LightningRL; the checker stays frozen.

CPU (default): the locally built tiny model, warm-started on synthetic demonstrations, trained on
templated questions over a small SQLite database. About 3 minutes on 2 idle cores; the reward
curve is whatever the tiny model manages (see <out>/metrics.jsonl and reward_curve.png):

    uv run python examples/sql_agent/train.py

GPU / a real model (no warm start needed; Spider if you have it):

    uv run python examples/sql_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --warm-start-steps 0 --steps 100 --batch-size 32 --group-size 8 --max-tokens 256 --lr 1e-6 \\
        --spider-dir /data/spider

The agent is ordinary LangChain code (sql_graph.py) with one ChatOpenAI pointed at any URL; the
only Lightning line is ``lightning_langchain.instrument(trainable=["writer", "rewriter"])``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("LANGSMITH_TRACING", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the example's own modules

from sql_data import build_database, load_spider, make_tasks, run_query  # noqa: E402
from sql_graph import CHECKER_PROMPT, REWRITER_PROMPT, WRITER_PROMPT  # noqa: E402

__all__ = ["main", "parse_args", "demonstrations"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Train the writer and rewriter roles of a LangGraph text-to-SQL agent (writer -> checker -> "
            "rewriter, one shared ChatOpenAI) with LightningRL. Reward: execution match with the gold "
            "query; AIR: a penalty on each call whose SQL failed to execute."
        ),
        epilog=(
            "CPU (default): the tiny local model (--model tiny --device cpu), warm-started on synthetic "
            "demonstrations; about 3 minutes on 2 idle cores. GPU: e.g. --model Qwen/Qwen2.5-0.5B-Instruct "
            "--device cuda --warm-start-steps 0 --steps 100 --batch-size 32 --group-size 8 --max-tokens 256 "
            "--lr 1e-6 [--spider-dir /data/spider]."
        ),
    )
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally, CPU) or an HF model name/folder")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--out", default="runs/sql_agent", help="run folder (metrics.jsonl, reward_curve.png)")
    parser.add_argument("--steps", type=int, default=8, help="training steps")
    parser.add_argument("--batch-size", type=int, default=8, help="tasks per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per task (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=96, help="most tokens per model reply")
    parser.add_argument("--max-rewrites", type=int, default=1, help="rewriter rounds after the first check")
    parser.add_argument("--n-train", type=int, default=64, help="templated training questions")
    parser.add_argument("--n-val", type=int, default=16, help="templated held-out questions (0: no validation)")
    parser.add_argument("--warm-start-steps", type=int, default=300, help="supervised warm-start steps (0: none)")
    parser.add_argument("--spider-dir", default=None, help="a Spider folder (train_spider.json, dev.json, database/)")
    parser.add_argument("--lr", type=float, default=2e-4, help="RL learning rate (1e-3 degraded the tiny model)")
    parser.add_argument("--tool-error-reward", type=float, default=-0.1, help="AIR reward per failed SQL execution")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def _tasks(args: argparse.Namespace, out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if args.spider_dir:
        train = load_spider(args.spider_dir, "train_spider", limit=args.n_train)
        val = load_spider(args.spider_dir, "dev", limit=args.n_val) if args.n_val else []
        return train, val
    db = build_database(out / "company.sqlite", seed=args.seed)
    tasks = make_tasks(args.n_train + args.n_val, db, seed=args.seed)
    return tasks[: args.n_train], tasks[args.n_train :]


def _corrupt(sql: str, rng: random.Random) -> str:
    """A plausible wrong query: a misspelt table (fails to run) or a wrong column (wrong rows)."""
    if rng.random() < 0.5:
        return sql.replace("employees", "employee", 1).replace("departments", "department", 1)
    return sql.replace("name", "dept", 1) if "SELECT name" in sql else sql.replace("COUNT(*)", "MAX(id)", 1)


def demonstrations(tasks: Sequence[dict[str, Any]], *, seed: int = 0) -> list[tuple[list[dict[str, str]], str]]:
    """(messages, reply) pairs for all three roles, in the exact messages the graph sends.

    The writer demonstrator is sloppy (a third of its queries are wrong), so the warm-started
    model is imperfect and RL has something to fix; the checker and rewriter are demonstrated
    correctly (the checker is not trained, but it shares the model).
    """
    rng = random.Random(seed)
    out: list[tuple[list[dict[str, str]], str]] = []
    for task in tasks:
        gold, schema = task["gold_sql"], task["schema"]
        written = _corrupt(gold, rng) if rng.random() < 0.33 else gold
        out.append(
            (
                [
                    {"role": "system", "content": WRITER_PROMPT.format(schema=schema)},
                    {"role": "user", "content": task["question"]},
                ],
                written,
            )
        )
        try:
            result = repr(run_query(task["db_path"], written, max_rows=20))
        except Exception as exc:
            result = f"Error: {exc}"
        verdict = "CORRECT" if written == gold else "WRONG: the query does not answer the question"
        check = f"Question: {task['question']}\nQuery: {written}\nResult: {result}"
        out.append(([{"role": "system", "content": CHECKER_PROMPT}, {"role": "user", "content": check}], verdict))
        if written != gold:
            rewrite = f"Question: {task['question']}\nQuery: {written}\nFeedback: {verdict}"
            system = REWRITER_PROMPT.format(schema=schema)
            out.append(([{"role": "system", "content": system}, {"role": "user", "content": rewrite}], gold))
    return out


def warm_start(model_dir: Path, out_dir: Path, tasks: Sequence[dict[str, Any]], *, steps: int, seed: int) -> Path:
    """Supervised warm start of the tiny model on :func:`demonstrations`; saves an HF folder."""
    from lightning_rl.trainer.warm_start import sft_on_chats

    demos = [(messages, None, reply) for messages, reply in demonstrations(tasks, seed=seed)]
    done = sft_on_chats(
        model_dir,
        out_dir,
        demos,
        steps=steps,
        seed=seed,
        batch_size=16,
        warmup_steps=min(20, steps // 5),
        final_lr_fraction=1.0,
    )
    (out_dir / "warm_start.json").write_text(
        json.dumps({"final_losses": done.losses[-5:], "examples": done.n_examples})
    )
    return out_dir


def main(argv: Sequence[str] | None = None) -> float | None:
    """Train; returns the held-out reward after training (or the last training reward without validation)."""
    args = parse_args(argv)
    import httpx
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr
    from sql_graph import build_graph, solve

    import lightning_langchain
    from lightning_rl.backends.torch_backend import TorchBackendConfig
    from lightning_rl.trainer import Trainer, TrainerConfig, TrainResult
    from lightning_rl.trainer.services import resolve_model
    from lightning_rl.types import Task

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, val = _tasks(args, out)

    model_path = str(args.model)
    if args.model == "tiny" and args.warm_start_steps > 0:
        model_path = str(
            warm_start(resolve_model("tiny"), out / "warm_start", train, steps=args.warm_start_steps, seed=args.seed)
        )

    # The one Lightning line: route, attribute roles, record tools; train only writer and rewriter.
    lightning_langchain.instrument(trainable=["writer", "rewriter"])

    # The user's model, as in production: any base URL and name (the gateway serves the policy). It
    # has its own httpx client, closed when training ends in the event loop that used it; without one,
    # langchain-openai hands out a process-wide cached client whose pooled connections outlive this
    # run's event loop and gateway (open sockets until exit, stale connections for a second run).
    http = httpx.AsyncClient()
    chat = ChatOpenAI(
        model="sql-writer",
        base_url=os.environ.get("SQL_AGENT_BASE_URL", "http://localhost:8000/v1"),
        api_key=SecretStr(os.environ.get("OPENAI_API_KEY", "EMPTY")),
        max_completion_tokens=args.max_tokens,
        temperature=1.0,
        max_retries=0,
        http_async_client=http,
    )
    graph = build_graph(chat, max_rewrites=args.max_rewrites)

    async def sql_agent(task: dict[str, Any], llm: Any) -> float:
        return await solve(graph, task)

    config = TrainerConfig(
        model=model_path,
        run_dir=str(out),
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        val_every=0,
        air={"tool_error": args.tool_error_reward},
        seed=args.seed,
        device=args.device,
        progress=not args.quiet,
        tensorboard=False,
        concurrency=args.batch_size * args.group_size,
        backend=TorchBackendConfig(lr=args.lr, seed=args.seed, old_logprobs="sampled"),
    )

    async def fit() -> TrainResult:
        try:
            return await Trainer(config).fit_async(
                sql_agent, [Task(input=t) for t in train], [Task(input=t) for t in val]
            )
        finally:
            await http.aclose()

    try:
        result = asyncio.run(fit())
    finally:
        lightning_langchain.uninstrument()
    rewards = [row["train/reward_mean"] for row in result.history if "train/reward_mean" in row]
    print(f"held-out reward: before {result.val_before}, after {result.val_after}; train rewards {rewards}")
    print(f"metrics: {out / 'metrics.jsonl'}")
    return result.val_after if result.val_after is not None else (rewards[-1] if rewards else None)


if __name__ == "__main__":
    main()
