"""Train the writer and rewriter of the LangGraph SQL agent with LightningRL; the checker stays frozen.

CPU (default): the locally built tiny model, given a staged warm start (the skill of writing the
query, then the habit of answering from memory), trained with GRPO on templated questions over a
generated SQLite database and validated greedily on 100 held-out questions:

    uv run python examples/sql_agent/train.py --seed 0 --out runs/sql_agent

GPU / a real model (no warm start needed; Spider if you have it):

    uv run python examples/sql_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --warm-start-steps 0 --steps 100 --batch-size 32 --group-size 8 --max-tokens 256 --lr 1e-6 \\
        --spider-dir /data/spider

The agent is ordinary LangChain code (sql_graph.py) with one ChatOpenAI pointed at any URL; the
only Lightning line is ``lightning_langchain.instrument(trainable=["writer", "rewriter"])``.

Why a staged warm start (``lightning_rl.trainer.staged_warm_start``, docs/learning.md): a model that
cannot write the query gets no reward, and one fine-tuned on perfect demonstrations leaves RL
nothing to do. So the tiny model first learns from an expert to write each template's query with
the question's entity copied in, until greedy decoding does so on most held-aside *probe*
questions; then it picks up a sloppy demonstrator's habit of answering from memory ("The answer
is 52000.") instead of querying. A guess is not SQL: it fails to execute (an AIR ``tool_error`` on
the call that wrote it), the checker says so, and the rewriter usually guesses again. RL must
discover from reward alone that writing the query pays.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("LANGSMITH_TRACING", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the example's own modules

from sql_data import build_database, fake_entity, load_spider, run_query, split_tasks, variant  # noqa: E402
from sql_graph import SQLState, checker_messages, rewriter_messages, writer_messages  # noqa: E402

__all__ = ["main", "parse_args", "demonstrations", "copying_demonstrations", "guess", "warm_start", "WRONG", "CORRECT"]

CORRECT = "CORRECT"
WRONG = "WRONG: the query did not run."
"""The checker's two verdicts in the demonstrations (the checker is frozen: what it says in training
is what it learnt here, so it is taught to accept a query that runs and reject one that does not)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Train the writer and rewriter roles of a LangGraph text-to-SQL agent (writer -> checker -> "
            "rewriter, one shared ChatOpenAI) with LightningRL. Reward: execution match with the gold "
            "query; AIR: a penalty on each call whose SQL failed to execute."
        ),
        epilog=(
            "CPU (default): the tiny local model (--model tiny --device cpu) with a staged warm start "
            "(skill, then the habit of answering from memory); under 10 minutes on 2 idle cores. GPU: e.g. "
            "--model Qwen/Qwen2.5-0.5B-Instruct --device cuda --warm-start-steps 0 --steps 100 --batch-size 32 "
            "--group-size 8 --max-tokens 256 --lr 1e-6 [--spider-dir /data/spider]."
        ),
    )
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally, CPU) or an HF model name/folder")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--out", default="runs/sql_agent", help="run folder (metrics.jsonl, reward_curve.png)")
    parser.add_argument("--steps", type=int, default=12, help="training steps")
    parser.add_argument("--batch-size", type=int, default=16, help="tasks per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=48, help="most tokens per model reply")
    parser.add_argument("--max-rewrites", type=int, default=1, help="rewriter rounds after the first check")
    parser.add_argument("--n-train", type=int, default=180, help="training questions")
    parser.add_argument("--n-val", type=int, default=100, help="held-out questions (0: no validation)")
    parser.add_argument("--n-probe", type=int, default=48, help="questions that only check the warm start's skill")
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=1000,
        help="most expert steps of the staged warm start; it stops once the probes pass (0: no warm start)",
    )
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="make the warm start (OUT/warm_start) and stop; later runs reuse it with "
        "--model OUT/warm_start --warm-start-steps 0",
    )
    parser.add_argument("--polish-steps", type=int, default=150, help="expert steps with a decaying rate")
    parser.add_argument("--habit-steps", type=int, default=200, help="most steps on the sloppy demonstrator")
    parser.add_argument("--spider-dir", default=None, help="a Spider folder (train_spider.json, dev.json, database/)")
    parser.add_argument("--lr", type=float, default=3e-4, help="RL learning rate")
    parser.add_argument("--val-every", type=int, default=4, help="validate every this many steps")
    parser.add_argument("--val-temperature", type=float, default=0.0, help="held-out decoding (0: greedy)")
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=40,
        help="run a prompt prefix of at least this many tokens that an agent's requests share (its system "
        "prompt) once per micro-batch, in the warm start and in RL (0: off)",
    )
    parser.add_argument(
        "--untrainable-roles",
        choices=["shared", "frozen"],
        default="shared",
        help="shared: the checker is answered by the policy under training; frozen: by the starting weights",
    )
    parser.add_argument(
        "--adapters",
        choices=["shared", "per_role"],
        default="shared",
        help="shared: the trainable roles train one set of weights; per_role: each trains its own LoRA adapter "
        "over one frozen base, which answers every other role (docs/adapters.md)",
    )
    parser.add_argument(
        "--lora-rank", type=int, default=8, help="LoRA rank of each role's adapter (--adapters per_role)"
    )
    parser.add_argument(
        "--adapter-lr", type=float, default=3e-3, help="RL learning rate of the adapters (--adapters per_role)"
    )
    parser.add_argument("--tool-error-reward", type=float, default=-0.1, help="AIR reward per failed SQL execution")
    parser.add_argument("--seed", type=int, default=0, help="seeds the database, the split, the warm start and RL")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


Tasks = list[dict[str, Any]]


def _tasks(args: argparse.Namespace, out: Path) -> tuple[Tasks, Tasks, Tasks]:
    """(training, held-out, probe) questions: disjoint, over a database built in the run folder."""
    if args.spider_dir:
        train = load_spider(args.spider_dir, "train_spider", limit=args.n_train)
        val = load_spider(args.spider_dir, "dev", limit=args.n_val) if args.n_val else []
        return train, val, []
    db = build_database(out / "company.sqlite", seed=args.seed)
    return split_tasks(db, args.n_train, args.n_val, args.n_probe, seed=args.seed)


@functools.cache
def _column_values(db_path: str, table: str, column: str) -> list[str]:
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        return [str(r[0]) for r in db.execute(f"SELECT DISTINCT {column} FROM {table} ORDER BY 1")]


def guess(task: dict[str, Any], rng: random.Random) -> str:
    """An answer from memory: a plausible value of the asked-for kind (a salary, a department...), not a query."""
    words = task["gold_sql"].split()
    selected, table = words[1], words[3]
    if selected.startswith("count("):
        value = str(rng.randint(1, 40))
    else:
        column = selected.removeprefix("max(").removeprefix("min(").rstrip(")")
        value = rng.choice(_column_values(task["db_path"], table, column))
    return f"The answer is {value}."


def _result(task: dict[str, Any], query: str) -> str:
    """What the graph's ``_run`` hands the checker for ``query``."""
    try:
        return repr(run_query(task["db_path"], query, max_rows=20))
    except (sqlite3.Error, ValueError) as exc:
        return f"Error: {exc}"


def _chat(messages: list[Any]) -> list[dict[str, str]]:
    """LangChain messages as the OpenAI-style dicts ChatOpenAI sends."""
    roles = {"system": "system", "human": "user", "ai": "assistant"}
    return [{"role": roles[m.type], "content": str(m.content)} for m in messages]


Demo = tuple[list[dict[str, str]], None, str]


def demonstrations(tasks: Sequence[dict[str, Any]], *, query_rate: float, seed: int) -> dict[str, list[Demo]]:
    """Demonstrations of all three roles, in the exact messages the graph sends, by role.

    The demonstrated writer writes the gold query with probability ``query_rate`` and otherwise
    answers from memory (:func:`guess`); the checker then reads the query's real result and says
    ``CORRECT`` if it ran, else ``WRONG``; after a failure the rewriter writes the gold query with
    probability ``query_rate`` or guesses again. ``query_rate=1`` is the expert: its rewriter
    demonstrations still follow a guess (the only thing a rewriter sees after a checker that accepts
    every query that runs). Keys: ``writer``, ``checker``, ``rewriter``.
    """
    rng = random.Random(seed)
    out: dict[str, list[Demo]] = {"writer": [], "checker": [], "rewriter": []}
    for task in tasks:
        state: SQLState = {"question": task["question"], "schema": task["schema"], "db_path": task["db_path"]}
        gold = task["gold_sql"]
        written = gold if rng.random() < query_rate else guess(task, rng)
        out["writer"].append((_chat(writer_messages(state)), None, written))
        out["checker"].append(_check(task, state, written))
        if written == gold and query_rate < 1.0:
            continue  # the checker accepted the query: the graph ends
        # a failed query (for the expert, a guess it never made: its checker and rewriter must handle one)
        failed = written if written != gold else guess(task, rng)
        if written == gold:
            out["checker"].append(_check(task, state, failed))
        rewritten = gold if rng.random() < query_rate else guess(task, rng)
        out["rewriter"].append(
            (_chat(rewriter_messages({**state, "query": failed, "feedback": WRONG})), None, rewritten)
        )
        if rewritten != gold:
            out["checker"].append(_check(task, state, rewritten))
    return out


def copying_demonstrations(tasks: Sequence[dict[str, Any]], *, per_task: int, seed: int) -> list[Demo]:
    """Writer and rewriter demonstrations of each task's template about random made-up entities.

    Why: with 180 questions repeated for hundreds of steps, a small model can lower its loss by
    recalling each question's query instead of reading the entity from the question, and that does
    not carry over to held-out questions. An entity that is nowhere else leaves copying it from the
    question as the only way to predict the query (the demo's ``reporting_demonstrations`` do the
    same for tool results). Templated tasks only (Spider tasks have no template)."""
    rng = random.Random(seed)
    out: list[Demo] = []
    for task in tasks:
        if "template" not in task:
            continue
        for _ in range(per_task):
            question, query = variant(task, fake_entity(task["template"][0], rng))
            state: SQLState = {"question": question, "schema": task["schema"], "db_path": task["db_path"]}
            out.append((_chat(writer_messages(state)), None, query))
            failed: SQLState = {**state, "query": f"The answer is {rng.randint(1, 99) * 1000}.", "feedback": WRONG}
            out.append((_chat(rewriter_messages(failed)), None, query))
    return out


def _check(task: dict[str, Any], state: SQLState, query: str) -> Demo:
    """The checker's demonstration for ``query``: ``CORRECT`` if it runs, else ``WRONG``."""
    result = _result(task, query)
    verdict = WRONG if result.startswith("Error") else CORRECT
    return (_chat(checker_messages({**state, "query": query, "result": result})), None, verdict)


def _share(demos: Sequence[Demo], share: float, *, seed: int) -> list[Demo]:
    """A seeded random ``share`` of ``demos`` (each kept with that probability)."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"checker_share must be in (0, 1], got {share}")
    rng = random.Random(seed)
    return [d for d in demos if rng.random() < share]


def warm_start(
    model_dir: Path,
    out_dir: Path,
    train: Sequence[dict[str, Any]],
    probe: Sequence[dict[str, Any]],
    *,
    seed: int,
    expert_steps: int = 1000,
    polish_steps: int = 150,
    habit_steps: int = 200,
    habit_query_rate: float = 0.3,
    copy_per_task: int = 4,
    checker_share: float = 0.5,
    shared_prefix: int = 40,
    progress: bool = True,
) -> Path:
    """The staged warm start of the tiny model (skill, polish, habit); saves an HF folder at ``out_dir``.

    Skill: expert demonstrations of the three roles until greedy decoding writes the exact gold query
    for at least 0.6 of the probe questions as writer, and the checker's verdict as checker. Habit: the
    sloppy demonstrator (queries with probability ``habit_query_rate``) until the writer and the
    rewriter start a query (its first token, ``select``'s) with mean probability <= 0.25 and greedily
    on <= 0.1 of the probe prompts. The probe questions are neither training nor held-out questions.

    The skill phase's batches are mostly queries to copy: ``copy_per_task`` made-up-entity
    demonstrations of the writer and of the rewriter per training question, and only a random
    ``checker_share`` of the checker's (its verdict is learnt within a few hundred steps, the copying
    is what takes a thousand). Measured in ``benchmarks/examples.py``'s runs (``warm_start.json``): with
    2 copies and every checker row, seed 0's writer probe was 0.27 at a 1,500-step cap (commit 331f8fd);
    with 4 and half, seeds 1 and 2 passed 0.6 at steps 800 and 700 and seed 0 reached 0.35 at the
    1,000-step cap (0.44 after the polish) and still gained like the others (commit 49c9228).
    """
    from transformers import AutoTokenizer

    from lightning_rl.trainer.staged_warm_start import StagedWarmStartConfig, staged_warm_start

    expert = demonstrations(train, query_rate=1.0, seed=seed)
    sloppy = demonstrations(train, query_rate=habit_query_rate, seed=seed + 1)
    probes = demonstrations(probe, query_rate=1.0, seed=seed + 2)
    # the good move is not a tool call but a query: the habit is measured on the query's first token
    first = AutoTokenizer.from_pretrained(model_dir).tokenize("select")[0]
    staged_warm_start(
        model_dir,
        out_dir,
        # the writer's and rewriter's queries (copying the entity) are the slow skill: most of each batch
        # (copy_per_task made-up-entity demonstrations of each per training question, beside the real ones)
        expert=[
            *expert["writer"],
            *expert["rewriter"],
            *_share(expert["checker"], checker_share, seed=seed + 4),
            *copying_demonstrations(train, per_task=copy_per_task, seed=seed + 3),
        ],
        sloppy=[d for demos in sloppy.values() for d in demos],
        # phase 1 ends on the writer's and the checker's probes: the rewriter's query is the same skill
        # seen after a failure, and its probe lags the writer's by hundreds of steps (measured: it had
        # not passed 0.6 at a 1,500-step cap) while adding nothing RL needs to start from
        probes={"writer": probes["writer"], "checker": probes["checker"]},
        habit_prompts=[*probes["writer"], *probes["rewriter"]],
        config=StagedWarmStartConfig(
            seed=seed,
            expert_steps=expert_steps,
            polish_steps=polish_steps,
            habit_steps=habit_steps,
            tool_token=first,
            shared_prefix=shared_prefix,
            progress=progress,
        ),
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
    from lightning_rl.agent import LLM
    from lightning_rl.backends.torch_backend import TorchBackendConfig
    from lightning_rl.trainer import Trainer, TrainerConfig, TrainResult
    from lightning_rl.trainer.services import resolve_model
    from lightning_rl.types import Task

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train, val, probe = _tasks(args, out)

    model_path = str(args.model)
    if args.model == "tiny" and args.warm_start_steps > 0:
        model_path = str(
            warm_start(
                resolve_model("tiny"),
                out / "warm_start",
                train,
                probe,
                seed=args.seed,
                expert_steps=args.warm_start_steps,
                polish_steps=args.polish_steps,
                habit_steps=args.habit_steps,
                shared_prefix=args.shared_prefix,
                progress=not args.quiet,
            )
        )

    if args.warm_only:
        print(f"warm start: {model_path}")
        return None

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

    async def sql_agent(task: dict[str, Any], llm: LLM) -> float:
        # the run's temperature: sampled in training, greedy on the held-out questions
        return await solve(graph, task, temperature=llm.sampling.get("temperature"))

    config = TrainerConfig(
        model=model_path,
        run_dir=str(out),
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        temperature=1.0,
        val_temperature=args.val_temperature,
        val_every=args.val_every,
        air={"tool_error": args.tool_error_reward},
        seed=args.seed,
        device=args.device,
        progress=not args.quiet,
        tensorboard=False,
        concurrency=args.batch_size * args.group_size,
        untrainable_roles=args.untrainable_roles,
        adapters=args.adapters,
        backend=TorchBackendConfig(
            lr=args.adapter_lr if args.adapters == "per_role" else args.lr,
            seed=args.seed,
            old_logprobs="sampled",
            temperature=1.0,
            shared_prefix=args.shared_prefix,
            lora_rank=args.lora_rank if args.adapters == "per_role" else 0,
        ),
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
