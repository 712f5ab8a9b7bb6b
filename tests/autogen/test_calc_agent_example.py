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
    yield {name: importlib.import_module(name) for name in ("calc_tasks", "calc_autogen_agent", "calc_warm_start")}


def test_generated_problems_are_distinct_deterministic_and_right(example: dict[str, ModuleType]) -> None:
    tasks = example["calc_tasks"]
    a, b = tasks.make_tasks(100, seed=1), tasks.make_tasks(100, seed=1)
    assert [t.input for t in a] == [t.input for t in b] and len({t.input["question"] for t in a}) == 100
    for t in a:
        assert t.input["answer"] == tasks.evaluate(t.input["expression"]) and float(t.input["answer"]).is_integer()
        left, op, right = t.input["expression"].split()  # one step, small operands, a whole positive answer
        assert op in "+-*/" and tasks.LOW <= int(right) <= tasks.HIGH and t.input["answer"] > 0
        assert left in t.input["question"] and right in t.input["question"]
    train, val, probe = tasks.split_tasks(300, 100, 100, seed=0)
    keys = [{tasks.problem_key(t.input["expression"]) for t in part} for part in (train, val, probe)]
    assert [len(k) for k in keys] == [300, 100, 100] and not (
        keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2]
    )
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


async def test_the_demonstrations_are_the_requests_autogen_sends(example: dict[str, ModuleType]) -> None:
    """The warm start teaches what the gateway will render in training: both of AssistantAgent's calls
    (the first with the calculator's schema; the reflection after the tool result without any tools),
    rendered with the tiny model's chat template, token for token."""
    pytest.importorskip("torch")
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.engine.models import resolve_model

    warm, tasks = example["calc_warm_start"], example["calc_tasks"]
    task = tasks.make_tasks(1, seed=3)[0]
    bodies: list[dict[str, Any]] = []

    def reply(body: dict[str, Any]) -> FakeReply | str:
        bodies.append(body)
        if body["messages"][-1]["role"] == "tool":
            return f"The answer is {body['messages'][-1]['content']}."
        return FakeReply(tool_calls=[FakeToolCall("calculator", {"expression": task.input["expression"]})])

    async with GatewayHarness(responder=reply) as h:
        async with h.attempt() as claim:
            assert await example["calc_autogen_agent"].calc_agent(task.input, h.llm(claim)) == 1.0
    assert [bool(b.get("tools")) for b in bodies] == [True, False]  # reflect_on_tool_use: no tools the 2nd time
    tools = [warm.tool_schema()]
    call = warm.expert_calls([task], tools)[0]
    report = warm.true_reports([task])[0]
    assert report[2] == f"The answer is {task.input['answer']}."
    engine = TransformersEngine.from_pretrained(resolve_model("tiny"))
    try:
        for body, (messages, demo_tools, _) in zip(bodies, (call, report), strict=True):
            assert engine.encode_chat(body["messages"], body.get("tools")) == engine.encode_chat(messages, demo_tools)
        parsed = engine.tokenizer.decode(engine.tokenizer.encode(call[2], add_special_tokens=False))
        assert parsed == call[2] and '"expression": "' + task.input["expression"] in parsed
    finally:
        engine.close()
    # the copy demonstrations never show a held-out problem
    train, val, probe = tasks.split_tasks(40, 30, 30, seed=0)
    exclude = {tasks.problem_key(t.input["expression"]) for t in (*val, *probe)}
    copies = warm.copy_calls(train, tools, per_task=5, exclude=exclude, seed=0)
    shown = {json.loads(c[2][len("<tool_call>") : -len("</tool_call>")])["arguments"]["expression"] for c in copies}
    assert len(copies) == 200 and not {tasks.problem_key(e) for e in shown} & exclude


def test_the_example_trains_a_few_steps_and_writes_metrics(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import importlib.util

    spec = importlib.util.spec_from_file_location("calc_agent_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    out = tmp_path / "run"
    args = [
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--group-size",
        "2",
        "--n-train",
        "6",
        "--n-val",
        "2",
        "--n-probe",
        "2",
    ]
    args += ["--warm-start-steps", "2", "--polish-steps", "2", "--habit-steps", "2", "--val-every", "0"]
    args += ["--max-tokens", "24", "--out", str(out), "--quiet"]
    result = train.main(args)
    assert result is not None and math.isfinite(result)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/n_rollouts"] == 4 and r["train/failed_rollouts"] == 0 for r in steps)
    assert all(r["train/n_transitions"] >= 4 for r in steps)  # at least one call per rollout reached training
    assert (out / "warm_start" / "config.json").exists()
    record = json.loads((out / "warm_start" / "warm_start.json").read_text())
    assert record["skills"]["expert_steps"] == 2 and record["examples"] == 6 * (1 + 2 + 3)  # call, copies, reports


def test_the_run_file_trains_with_lightning_rl_train(tmp_path: Path) -> None:
    """``lightning-rl train examples/calc_agent/config.toml``, short: the same tasks and warm start."""
    pytest.importorskip("torch")
    from lightning_rl.cli import main

    run_dir = tmp_path / "run"
    overrides = [
        f"run_dir={run_dir}",
        "val_tasks=null",
        "warm_start.expert_steps=2",
        "warm_start.polish_steps=2",
        "warm_start.habit_steps=2",
        "algorithm.steps=2",
        "algorithm.batch_size=2",
        "algorithm.group_size=3",
        "algorithm.concurrency=6",
        "algorithm.max_tokens=24",
        "algorithm.tensorboard=false",
    ]
    assert main(["train", str(EXAMPLE / "config.toml"), "--quiet", *[a for o in overrides for a in ("--set", o)]]) == 0
    record = json.loads((run_dir / "warm_start" / "warm_start.json").read_text())
    assert record["examples"] == 300 * (1 + 2 + 3) and {"base/tool_call", "base/report"} <= set(record["skills"])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2] and all(r["train/n_rollouts"] == 6 for r in train)
