"""The crew example trains end to end for a few steps on the tiny model and writes its metrics.

It runs ``examples/crew_agent/train.py`` as a user would (its ``main`` with small settings): a short
staged warm start on demonstrations captured from the real crew, then real CrewAI crews, the
plugin, the gateway, the store and the torch backend. Only the researcher is trainable, so the
writer's calls must be counted as untrainable and never become transitions. The task split must
keep held-out items out of training, and the demonstrations must be what CrewAI really sends.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from lightning_crewai import CrewAIInstrumentor
from lightning_rl import semconv
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import Task

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")

TRAIN_PY = Path(__file__).resolve().parents[2] / "examples" / "crew_agent" / "train.py"


@pytest.fixture
def train_module() -> Iterator[ModuleType]:
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("crew_agent_train", TRAIN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    CrewAIInstrumentor().uninstrument()  # main() instruments the process; leave it as we found it


@pytest.fixture
def example() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The example's task and warm-start modules, with CrewAI instrumented as ``train.py`` does."""
    sys.path.insert(0, str(TRAIN_PY.parent))
    try:
        tasks, warm = importlib.import_module("crew_tasks"), importlib.import_module("crew_warm_start")
        CrewAIInstrumentor().instrument(trainable=["Researcher"])
        yield tasks, warm
    finally:
        CrewAIInstrumentor().uninstrument()
        sys.path.remove(str(TRAIN_PY.parent))
        # each captured crew's CrewAI LLM leaves its HTTP client to the garbage collector (CrewAI's, not ours)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


def test_held_out_items_are_never_trained_on_and_misspellings_fail_the_lookup(
    example: tuple[ModuleType, ModuleType],
) -> None:
    tasks, _ = example
    for seed in (0, 1, 2):
        split = tasks.split_items(seed=seed)
        assert len(split.val) >= 100 and split.probe and split.train
        assert not set(split.val) & set(split.train) and not set(split.probe) & (set(split.train) | set(split.val))
        # held-out items are new combinations of words the training items use
        words = {w for item in split.train for w in item.split()}
        assert all(set(item.split()) <= words for item in split.val)
    assert tasks.split_items(seed=0) != tasks.split_items(seed=1)
    questions = tasks.make_tasks(tasks.split_items(seed=0).train, 200, seed=0)
    misspelt = [t.input for t in questions if t.input["asked_as"] != t.input["item"]]
    assert 20 <= len(misspelt) <= 60  # about 1 in 5: looking those up as asked is a tool error (AIR)
    assert all(q["asked_as"] not in tasks.CATALOGUE and q["item"] in tasks.CATALOGUE for q in misspelt)
    lookup_price = importlib.import_module("crew_agent").lookup_price.func
    for item in tasks.CATALOGUE:  # ... whose message names the right item
        with pytest.raises(ValueError, match=f"did you mean '{item}'"):
            lookup_price(tasks.misspell(item))


def test_demonstrations_are_what_crewai_sends_and_copy_the_price(example: tuple[ModuleType, ModuleType]) -> None:
    """The expert looks the item up under its catalogue name and reports the tool's result; the writer
    copies the report's number; repricing swaps the price everywhere CrewAI carried it."""
    tasks, warm = example
    questions = [
        Task(input={"item": "pink desk", "asked_as": "pink-desk", "answer": tasks.CATALOGUE["pink desk"]}),
        Task(input={"item": "red mug", "asked_as": "red mug", "answer": tasks.CATALOGUE["red mug"]}),
    ]
    crews = asyncio.run(warm.capture(questions, tool_rate=1.0, seed=0))
    for crew, question in zip(crews, questions, strict=True):
        price = question.input["answer"]
        asked, item = question.input["asked_as"], question.input["item"]
        (messages, tools, call), *retry = crew.calls
        assert [t["function"]["name"] for t in tools] == ["lookup_price"]
        assert messages[0]["content"].startswith("You are Researcher.")
        assert f'Look up: "{asked}".' in messages[-1]["content"]
        assert _call(call) == {"name": "lookup_price", "arguments": {"item": asked}}
        if asked != item:  # the misspelling fails the lookup; the error names the item, looked up next
            ((retry_messages, _, retry_call),) = retry
            assert retry_messages[-1]["role"] == "tool" and f"did you mean '{item}'?" in retry_messages[-1]["content"]
            assert _call(retry_call) == {"name": "lookup_price", "arguments": {"item": item}}
        else:
            assert not retry
        assert crew.report is not None and crew.writer is not None and crew.price == price
        assert crew.report[0][-1]["role"] == "tool" and crew.report[2] == f"{price} euros"
        writer_messages, writer_tools, answer = crew.writer
        assert not writer_tools and writer_messages[0]["content"].startswith("You are Writer.")
        assert writer_messages[-1]["content"].rstrip().endswith(f"{price} euros\n\nProvide your complete response:")
        assert answer == str(price)
        made_up = warm.renamed(crew.calls[-1], {asked: "vok-trisa", item: "vok trisa"})
        assert item not in json.dumps(made_up) and '{"item": "vok trisa"}' in made_up[2]
        swapped = warm.repriced(crew.writer, price, 4321)
        assert swapped[2] == "4321" and "4321 euros" in swapped[0][-1]["content"]
        assert f"{price} euros" not in swapped[0][-1]["content"]
    sloppy = asyncio.run(warm.capture(questions, tool_rate=0.0, seed=0))
    assert all(not c.calls and c.report is not None and c.report[0][-1]["role"] == "user" for c in sloppy)
    assert all(c.writer is not None and c.price is not None and c.writer[2] == str(c.price) for c in sloppy)


def test_the_tokenizer_corpus_holds_crewais_text_but_no_item_name_or_price(
    example: tuple[ModuleType, ModuleType],
) -> None:
    """What the crew's tiny tokenizer learns from: CrewAI's instructions and the tool's syntax and
    errors, never a name or a number the model must copy (one would become a single, untrained token)."""
    tasks, warm = example
    questions = [
        Task(input={"item": "pink desk", "asked_as": "pink-desk", "answer": tasks.CATALOGUE["pink desk"]}),
        Task(input={"item": "red mug", "asked_as": "red mug", "answer": tasks.CATALOGUE["red mug"]}),
    ]
    corpus = warm.tokenizer_corpus(asyncio.run(warm.capture(questions, tool_rate=1.0, seed=0)), questions)
    text = "\n".join(corpus)
    assert "you MUST return the actual complete content" in text and "lookup_price" in text
    assert "no catalogue item named" in text  # the misspelt lookup's error
    assert not any(name in text for name in ("pink desk", "pink-desk", "red mug"))
    assert not any(ch.isdigit() for ch in text)


def _call(completion: str) -> object:
    return json.loads(completion.removeprefix("<tool_call>").removesuffix("</tool_call>"))


def _roles(run_dir: Path) -> list[str | None]:
    async def read() -> list[str | None]:
        store = SQLiteStore(run_dir / "store.sqlite")
        try:
            return [s.attributes.get(semconv.ROLE) for s in await store.query_spans(name=semconv.SPAN_LLM_CALL)]
        finally:
            await store.close()

    return asyncio.run(read())


def test_the_crew_example_trains_a_few_steps_and_writes_metrics(train_module: ModuleType, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["--steps", "2", "--batch-size", "2", "--group-size", "3", "--warm-start-steps", "20", "--val-every", "0"]
    argv += ["--n-train", "8", "--n-val", "2", "--n-probe", "4"]
    result = train_module.main([*argv, "--out", str(run_dir), "--quiet"])
    assert result is not None and 0.0 <= result <= 1.0  # the held-out reward after training

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:
        assert row["train/n_rollouts"] == 6 and row["train/failed_rollouts"] == 0
        # each crew made researcher calls (trained) and writer calls (recorded, not trained)
        assert row["train/n_transitions"] >= 6 and row["train/untrainable_calls"] >= 6
    # Whether a 2-step run draws a group with uneven rewards (so an update happens) is up to sampling;
    # the README's full run shows the updates. Here: only transitions of the trained role are updated.
    assert all(0 <= r["train/n_updated_transitions"] <= r["train/n_transitions"] for r in train)
    warm = json.loads((run_dir / "warm_start" / "warm_start.json").read_text())
    assert {"base/tool_call", "base/report", "base/writer", "base/p_tool_call"} <= set(warm["skills"])
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 2]  # held out before and after
    assert (run_dir / "reward_curve.png").stat().st_size > 0
    roles = _roles(run_dir)
    assert set(roles) == {"Researcher", "Writer"}  # every gateway call carries its exact role
    total = sum(r["train/n_transitions"] + r["train/untrainable_calls"] for r in train)
    val = [r for r in rows if "val/reward_mean" in r]
    total += sum(r["val/role/Researcher/calls"] + r["val/role/Writer/calls"] for r in val)
    assert roles.count("Researcher") + roles.count("Writer") == total


def test_the_run_file_trains_the_same_crew_with_lightning_rl_train(tmp_path: Path) -> None:
    """``lightning-rl train examples/crew_agent/config.toml``, short: the session instruments CrewAI
    before the warm start (which captures demonstrations from the instrumented crew) and undoes it."""
    pytest.importorskip("torch")
    from lightning_rl.cli import main

    run_dir = tmp_path / "run"
    overrides = [
        f"run_dir={run_dir}",
        "val_tasks=null",
        "train_tasks.n=8",
        "warm_start.steps=4",
        "warm_start.n_probe=4",
        "algorithm.steps=2",
        "algorithm.batch_size=2",
        "algorithm.group_size=3",
        "algorithm.concurrency=6",
        "algorithm.tensorboard=false",
    ]
    argv = ["train", str(TRAIN_PY.parent / "config.toml"), "--quiet", *[a for o in overrides for a in ("--set", o)]]
    assert main(argv) == 0
    assert not CrewAIInstrumentor().is_instrumented  # the session's exit uninstrumented

    assert json.loads((run_dir / "warm_start" / "warm_start.json").read_text())["examples"] > 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for row in train:
        assert row["train/n_rollouts"] == 6 and row["train/failed_rollouts"] == 0
        assert row["train/n_transitions"] >= 6 and row["train/untrainable_calls"] >= 6
    assert set(_roles(run_dir)) == {"Researcher", "Writer"}
