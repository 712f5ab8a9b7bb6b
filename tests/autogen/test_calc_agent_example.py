"""The Calc-X example (examples/calc_agent): its tasks and loader, its agent against the real gateway, and training."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lightning_rl import semconv
from lightning_rl.adapter import air_policy
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calc_agent"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, ModuleType]]:
    """The example's modules, imported the way ``train.py`` imports them (its folder on sys.path)."""
    import importlib

    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield {name: importlib.import_module(name) for name in ("calc_tasks", "calc_autogen_agent")}


def test_generated_problems_are_distinct_deterministic_and_right(example: dict[str, ModuleType]) -> None:
    tasks = example["calc_tasks"]
    a, b = tasks.make_tasks(100, seed=1), tasks.make_tasks(100, seed=1)
    assert [t.input for t in a] == [t.input for t in b] and len({t.input["question"] for t in a}) == 100
    for t in a:
        assert t.input["answer"] == tasks.evaluate(t.input["expression"]) and float(t.input["answer"]).is_integer()
    assert tasks.score_answer("So the answer is 1,200.", 1200) == 1.0
    assert tasks.score_answer("The answer is 3/4", 0.75) == 1.0
    assert tasks.score_answer("I think 41", 42) == 0.0 and tasks.score_answer(None, 1) == 0.0
    for bad in ("__import__('os')", "2 **", "2 ** 1000"):
        with pytest.raises(ValueError):
            tasks.evaluate(bad)


def test_calcx_loader_reads_the_jsonl_format(example: dict[str, ModuleType], tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"id": "gsm8k__1", "question": "Q1", "chain": "<gadget>1+1</gadget>", "result": "2", "result_float": 2.0},
        {"id": "ape210k__2", "question": "Q2", "result": "3/4"},
        {"id": "aqua__3", "question": "Q3", "result": "not a number"},
        {"id": "mawps__4", "question": "Q4", "result": "1_000"},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    tasks = example["calc_tasks"].load_calcx(path)
    assert [(t.id, t.input["question"], t.input["answer"]) for t in tasks] == [
        ("gsm8k__1", "Q1", 2.0),
        ("ape210k__2", "Q2", 0.75),
        ("mawps__4", "Q4", 1000.0),
    ]
    assert len(example["calc_tasks"].load_calcx(path, limit=1)) == 1
    path.write_text('{"question": "no result"}\n')
    with pytest.raises(ValueError, match="train.jsonl:1"):
        example["calc_tasks"].load_calcx(path)


async def test_the_agent_is_scored_and_a_calculator_error_is_air_on_its_call(example: dict[str, ModuleType]) -> None:
    agent_fn = example["calc_autogen_agent"].calc_agent

    def reply(body: dict[str, Any]) -> FakeReply | str:
        messages = body["messages"]
        if messages[-1]["role"] == "tool":
            return f"The answer is {messages[-1]['content']}."
        broken = "oops" in messages[-1]["content"]
        return FakeReply(tool_calls=[FakeToolCall("calculator", {"expression": "7 / 0" if broken else "6 * 7"})])

    async with GatewayHarness(responder=reply) as h:
        async with h.attempt() as good:
            reward = await agent_fn({"question": "What is six times seven?", "answer": 42}, h.llm(good))
        assert reward == 1.0
        async with h.attempt() as bad:
            reward = await agent_fn({"question": "oops: seven over zero?", "answer": 0}, h.llm(bad))
        assert reward == 0.0  # the model reported the error text, not a number
        for claim, expected in ((good, [0.0, 0.0]), (bad, [-0.1, 0.0])):
            adapted = await h.adapt(claim, air=air_policy(tool_error=-0.1))
            assert [t.role for t in adapted.transitions] == ["calc_agent", "calc_agent"]
            assert [t.reward for t in adapted.transitions] == [pytest.approx(r) for r in expected]
        [tool] = [s for s in await h.spans(bad) if s.name == semconv.SPAN_TOOL]
        assert "division by zero" in tool.attributes[semconv.TOOL_ERROR]


def test_the_example_trains_a_few_steps_and_writes_metrics(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location("calc_agent_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    out = tmp_path / "run"
    args = ["--steps", "2", "--batch-size", "2", "--group-size", "2", "--n-train", "6", "--n-val", "2"]
    args += ["--warm-start-steps", "2", "--max-tokens", "24", "--out", str(out), "--quiet"]
    result = train.main(args)
    assert result is not None and math.isfinite(result)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/n_rollouts"] == 4 and r["train/failed_rollouts"] == 0 for r in steps)
    assert all(r["train/n_transitions"] >= 4 for r in steps)  # at least one call per rollout reached training
    assert (out / "warm_start" / "config.json").exists()
