"""The LangGraph SQL agent example (examples/sql_agent) trains for a few steps and writes its metrics."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sqlite3
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lightning_langchain import LangChainInstrumentor
from lightning_rl import semconv

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sql_agent"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"sql_agent_example_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def train_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return _load("train")


def test_help_documents_cpu_and_gpu_use(train_module: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_module.parse_args(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "--device" in text and "cpu" in text.lower() and "cuda" in text and "Qwen/Qwen2.5-0.5B-Instruct" in text


def test_the_example_trains_writer_and_rewriter_only_and_records_sql_errors(
    train_module: ModuleType, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "run"
    argv = ["--steps", "2", "--batch-size", "2", "--group-size", "2", "--n-train", "4", "--n-val", "2"]
    argv += ["--n-probe", "2", "--warm-start-steps", "2", "--polish-steps", "2", "--habit-steps", "2"]
    argv += ["--max-tokens", "16", "--quiet", "--out", str(out)]
    result = train_module.main(argv)
    assert result is not None
    assert not LangChainInstrumentor().is_instrumented  # main() cleans up after itself

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["train/n_rollouts"] == 4 and r["train/failed_rollouts"] == 0 for r in train)

    spans = asyncio.run(_spans(out / "store.sqlite"))
    calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL and "-s" in s.rollout_id]
    roles = Counter(s.attributes.get(semconv.ROLE) for s in calls)
    assert set(roles) <= {"writer", "checker", "rewriter"} and roles["writer"] == 8 and roles["checker"] >= 8
    # only the writer's and rewriter's calls became transitions
    assert sum(r["train/n_transitions"] for r in train) == roles["writer"] + roles["rewriter"]
    declared = {s.attributes[semconv.ROLE]: s.attributes[semconv.TRAINABLE] for s in spans if s.name == "agent"}
    assert declared["writer"] is True and declared["checker"] is False and declared.get("rewriter", True) is True
    # every SQL execution was recorded as a tool span of the role that wrote the query
    tools = [s for s in spans if s.name == semconv.SPAN_TOOL]
    assert tools and {s.attributes[semconv.ROLE] for s in tools} <= {"writer", "rewriter"}
    assert all(s.attributes[semconv.GEN_AI_TOOL_NAME] == "execute_sql" for s in tools)
    # the graph decodes at the run's temperature: sampled in training, greedy on held-out questions
    val_calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL and "-v" in s.rollout_id]
    assert val_calls and {s.attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] for s in val_calls} == {0.0}
    assert {s.attributes[semconv.GEN_AI_REQUEST_TEMPERATURE] for s in calls} == {1.0}
    assert (out / "warm_start" / "warm_start.json").is_file()


def test_defaults_hold_out_100_questions_disjoint_from_training_and_probe_questions(
    train_module: ModuleType, tmp_path: Path
) -> None:
    args = train_module.parse_args(["--out", str(tmp_path)])
    train, val, probe = train_module._tasks(args, tmp_path)
    assert len(val) >= 100 and len(train) >= 100 and probe
    questions = [{t["question"] for t in split} for split in (train, val, probe)]
    assert sum(map(len, questions)) == len(train) + len(val) + len(probe)  # no repeats inside a split
    assert not (questions[0] & questions[1] or questions[0] & questions[2] or questions[1] & questions[2])
    # the other seed draws another split of the same questions
    other = train_module._tasks(train_module.parse_args(["--seed", "1"]), tmp_path / "s1")
    assert {t["question"] for t in other[1]} != questions[1]


def test_expert_queries_match_and_sloppy_guesses_fail_to_run(train_module: ModuleType, tmp_path: Path) -> None:
    """The warm start's demonstrations: the expert's queries are the gold ones, the sloppy writer's
    guesses are not SQL (so they fail to execute: the AIR tool_error fires), the checker's verdicts
    say whether the query ran."""
    data = _load("sql_data")
    db = data.build_database(tmp_path / "company.sqlite")
    tasks = data.make_tasks(40, db)
    expert = train_module.demonstrations(tasks, query_rate=1.0, seed=0)
    assert len(expert["writer"]) == len(expert["rewriter"]) == len(tasks)
    for task, (messages, _, query) in zip(tasks, expert["writer"], strict=True):
        assert messages[-1] == {"role": "user", "content": task["question"]}
        assert data.execution_match(db, query, task["gold_sql"])
    sloppy = train_module.demonstrations(tasks, query_rate=0.3, seed=1)
    guesses = [completion for _, _, completion in sloppy["writer"] if completion.startswith("The answer is")]
    assert 0.5 * len(tasks) < len(guesses) < 0.9 * len(tasks)
    for text in guesses:
        with pytest.raises(sqlite3.Error):
            data.run_query(db, text)
    verdicts = Counter(completion for _, _, completion in expert["checker"] + sloppy["checker"])
    assert set(verdicts) == {train_module.CORRECT, train_module.WRONG} and min(verdicts.values()) > 10
    for messages, _, verdict in expert["checker"]:
        assert ("Result: Error" in messages[-1]["content"]) == (verdict == train_module.WRONG)


def test_the_warm_start_keeps_a_seeded_share_of_the_checker_demonstrations(train_module: ModuleType) -> None:
    """Half the checker's rows leave the skill phase's batches to the queries to copy; the share is
    seeded (a rerun trains on the same rows), and a share outside (0, 1] is refused."""
    demos = [([{"role": "user", "content": str(i)}], None, train_module.CORRECT) for i in range(400)]
    half = train_module._share(demos, 0.5, seed=4)
    assert 150 < len(half) < 250 and half == train_module._share(demos, 0.5, seed=4)
    assert train_module._share(demos, 1.0, seed=4) == demos
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="checker_share"):
            train_module._share(demos, bad, seed=4)


async def _spans(path: Path) -> list[Any]:
    from lightning_rl.store.sqlite import SQLiteStore

    store = SQLiteStore(path)
    try:
        return await store.query_spans()
    finally:
        await store.close()


def test_tasks_have_gold_queries_that_run_and_the_spider_loader_reads_spider_layout(tmp_path: Path) -> None:
    data = _load("sql_data")
    db = data.build_database(tmp_path / "company.sqlite")
    tasks = data.make_tasks(30, db, seed=1)
    assert len({t["question"] for t in tasks}) == 30
    assert len(data.all_tasks(db)) >= 300  # room for 100 held-out questions beside training and probes
    for task in data.all_tasks(db):
        assert data.run_query(task["db_path"], task["gold_sql"])  # every gold query returns rows
        assert data.execution_match(db, task["gold_sql"], task["gold_sql"])
    assert not data.execution_match(db, "SELECT * FROM nowhere", tasks[0]["gold_sql"])

    # a folder laid out like Spider: <split>.json + database/<db_id>/<db_id>.sqlite
    spider = tmp_path / "spider"
    (spider / "database" / "shop").mkdir(parents=True)
    with sqlite3.connect(spider / "database" / "shop" / "shop.sqlite") as conn:
        conn.execute("CREATE TABLE items (id INTEGER, price REAL)")
    entries = [
        {"db_id": "shop", "question": "How many items?", "query": "SELECT count(*) FROM items"},
        {"db_id": "missing", "question": "?", "query": "SELECT 1"},
    ]
    (spider / "dev.json").write_text(json.dumps(entries))
    [task] = data.load_spider(spider, "dev")
    assert task["question"] == "How many items?" and "CREATE TABLE items" in task["schema"]
    assert data.execution_match(task["db_path"], "SELECT COUNT(*) FROM items", task["gold_sql"])
    with pytest.raises(FileNotFoundError, match="train_spider.json"):
        data.load_spider(spider, "train_spider")


def test_the_run_file_trains_the_same_agent_with_lightning_rl_train(tmp_path: Path) -> None:
    """``lightning-rl train examples/sql_agent/config.toml``, short: the async session instruments
    LangChain and owns the ChatOpenAI client inside the training's event loop, and undoes both."""
    pytest.importorskip("torch")
    from lightning_rl.cli import main

    out = tmp_path / "run"
    overrides = [
        f"run_dir={out}",
        "val_tasks=null",
        "warm_start.expert_steps=2",
        "warm_start.polish_steps=2",
        "warm_start.habit_steps=2",
        "algorithm.steps=2",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "algorithm.concurrency=4",
        "algorithm.max_tokens=16",
    ]
    argv = ["train", str(EXAMPLE / "config.toml"), "--quiet", *[a for o in overrides for a in ("--set", o)]]
    assert main(argv) == 0
    assert not LangChainInstrumentor().is_instrumented  # the session's exit uninstrumented

    assert (out / "company.sqlite").is_file() and (out / "warm_start" / "warm_start.json").is_file()
    assert json.loads((out / "train_config.json").read_text())["warm_start"]["expert_steps"] == 2
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["train/n_rollouts"] == 4 and r["train/failed_rollouts"] == 0 for r in train)
    spans = asyncio.run(_spans(out / "store.sqlite"))
    calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL and "-s" in s.rollout_id]
    roles = Counter(s.attributes.get(semconv.ROLE) for s in calls)
    assert roles["writer"] == 8 and roles["checker"] >= 8  # each rollout ran the graph through the plugin
    assert sum(r["train/n_transitions"] for r in train) == roles["writer"] + roles["rewriter"]


def test_the_adapters_run_file_trains_one_adapter_per_role_and_answers_the_checker_from_the_base(
    tmp_path: Path,
) -> None:
    """``lightning-rl train examples/sql_agent/adapters.toml``, short: the writer and the rewriter each
    train their own LoRA adapter; the checker is answered by the base weights all along."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from lightning_rl.cli import main

    out = tmp_path / "run"
    overrides = [
        f"run_dir={out}",
        "val_tasks=null",
        "warm_start.expert_steps=2",
        "warm_start.polish_steps=2",
        "warm_start.habit_steps=2",
        "algorithm.steps=2",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "algorithm.concurrency=4",
        "algorithm.max_tokens=16",
    ]
    overrides.append("algorithm.skip_zero_advantage=false")  # a tie in every group must still make the adapters
    argv = ["train", str(EXAMPLE / "adapters.toml"), "--quiet", *[a for o in overrides for a in ("--set", o)]]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for role in ("writer", "rewriter"):  # each role's own update, on its own adapter
        assert train[0][f"train/adapter/{role}/optimizer_steps"] >= 1
    spans = asyncio.run(_spans(out / "store.sqlite"))
    calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL and "-s2-" in s.rollout_id]
    served = {(s.attributes[semconv.ROLE], s.attributes.get(semconv.ADAPTER)) for s in calls}
    assert ("writer", "writer") in served and ("checker", None) in served
    assert all(s.attributes[semconv.MODEL_VERSION] == 0 for s in calls if s.attributes[semconv.ROLE] == "checker")
    assert all(s.attributes.get(semconv.ADAPTER_VERSION) == 1 for s in calls if s.attributes[semconv.ROLE] == "writer")
    adapters = out / "checkpoints" / "step_00002" / "adapters"
    assert (adapters / "writer" / "adapter_config.json").is_file()
    assert (adapters / "rewriter" / "adapter_model.safetensors").is_file()


def test_a_warm_start_made_once_starts_later_runs(train_module: ModuleType, tmp_path: Path) -> None:
    """``--warm-only`` makes the warm start and stops (no training, no metrics); a later run starts from
    its folder with ``--model <it> --warm-start-steps 0`` (how benchmarks/examples.py --arms shares one)."""
    pytest.importorskip("torch")
    warm, run = tmp_path / "warm", tmp_path / "run"
    small = ["--n-train", "4", "--n-val", "2", "--n-probe", "2", "--max-tokens", "16", "--quiet"]
    steps = ["--warm-start-steps", "2", "--polish-steps", "2", "--habit-steps", "2"]
    assert train_module.main([*small, *steps, "--warm-only", "--out", str(warm)]) is None
    assert (warm / "warm_start" / "warm_start.json").is_file() and not (warm / "metrics.jsonl").exists()
    assert not LangChainInstrumentor().is_instrumented
    argv = [*small, "--steps", "1", "--batch-size", "2", "--group-size", "2", "--val-every", "0"]
    argv += ["--model", str(warm / "warm_start"), "--warm-start-steps", "0", "--out", str(run)]
    assert train_module.main(argv) is not None
    assert not (run / "warm_start").exists()  # nothing warm-started again
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/reward_mean" in r] == [1]
