"""The two-operation calculator task of issue 41: tasks, splits, demonstrations and the chained tool."""

from __future__ import annotations

import json

import pytest

from lightning_rl.demo.calculator import _Operands, score_answer  # pyright: ignore[reportPrivateUsage]
from lightning_rl.demo.two_step import (
    chats,
    make_chained_tasks,
    one_step_demonstrations,
    two_step_demonstrations,
    two_step_splits,
)
from lightning_rl.engine.toolcalls import parse_tool_calls


def test_two_operation_tasks_are_distinct_deterministic_and_answered_left_to_right() -> None:
    a, b = make_chained_tasks(80, operations=2, seed=4), make_chained_tasks(80, operations=2, seed=4)
    assert [t.input for t in a] == [t.input for t in b] and len({t.id for t in a}) == 80
    words = {"add": "plus", "subtract": "minus", "multiply": "times"}
    for task in a:
        x, y, z = task.input["operands"]
        first, second = task.input["operations"]
        value = {"add": x + y, "subtract": x - y, "multiply": x * y}[first]
        value = {"add": value + z, "subtract": value - z, "multiply": value * z}[second]
        assert task.input["answer"] == value
        assert f"{x} {words[first]} {y}" in task.input["question"] and f"{words[second]} {z}" in task.input["question"]
    with pytest.raises(ValueError, match="operations must be 1 or 2"):
        make_chained_tasks(1, operations=3, seed=0)
    with pytest.raises(ValueError, match="distinct"):
        make_chained_tasks(100, operations=1, seed=0, low=2, high=3)


def test_splits_are_disjoint_and_the_demonstrations_never_call_twice() -> None:
    split = two_step_splits(1, n_demo=30, n_train=40, n_val=10, n_test=20)
    ids = [t.id for t in split.train + split.val + split.test]
    assert len(ids) == len(set(ids)) == 70
    assert all(len(t.input["operands"]) == 2 for t in split.demo + split.val_one)
    assert len(split.val_one) == 10 and not {t.id for t in split.val_one} & {t.id for t in split.demo}
    assert all(len(t.input["operands"]) == 3 for t in split.train + split.val + split.test)
    assert two_step_splits(1, n_demo=30, n_train=40, n_val=10, n_test=20) == split
    demos = one_step_demonstrations(split.demo, seed=1, report_per_task=1)
    assert len(demos) == 3 * len(split.demo)  # a call, its report, one report of a random result
    for demo in demos:
        tool_turns = [m for m in demo.messages if m["role"] == "tool"]
        assert len(tool_turns) <= 1  # a call after a tool result is what no demonstration shows
        if tool_turns:
            assert parse_tool_calls(demo.completion).tool_calls == []
    messages, tools, _ = chats(demos[:1])[0]
    assert tools is not None and "previous result" in tools[0]["function"]["description"]
    assert messages[-1]["content"] == split.demo[0].input["question"]


def test_a_few_two_operation_demonstrations_show_every_turn_and_leave_the_other_splits_alone() -> None:
    plain = two_step_splits(2, n_demo=20, n_train=30, n_val=10, n_test=20)
    split = two_step_splits(2, n_demo=20, n_train=30, n_val=10, n_test=20, n_demo_two=5)
    assert (split.train, split.val, split.test, split.demo) == (plain.train, plain.val, plain.test, plain.demo)
    assert plain.demo_two == [] and len(split.demo_two) == 5
    assert not {t.id for t in split.demo_two} & {t.id for t in split.train + split.val + split.test}
    demos = two_step_demonstrations(split.demo_two)
    assert len(demos) == 3 * 5  # first call, second call, report
    task = split.demo_two[0].input
    first, second, report = demos[:3]
    calls = [parse_tool_calls(d.completion).tool_calls for d in (first, second)]
    assert [json.loads(c[0].arguments) for c in calls] == [{"operation": op} for op in task["operations"]]
    # the second call follows the tool's result of the first, as the chained calculator computes it
    chained = _Operands(task)
    assert second.messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": chained.apply(task["operations"][0]),
    }
    assert report.messages[-1]["content"] == chained.apply(task["operations"][1]) == str(task["answer"])
    assert (
        report.completion == f"The answer is {task['answer']}."
        and score_answer(report.completion, task["answer"]) == 1.0
    )


def test_the_chained_calculator_uses_each_number_once_in_order() -> None:
    chained = _Operands({"operands": [7, 12, 5]})
    assert chained.apply("multiply") == "84" and chained.apply("add") == "89"
    with pytest.raises(ValueError, match="every number"):
        chained.apply("add")
    with pytest.raises(ValueError, match="unknown operation"):
        _Operands({"operands": [1, 2]}).apply("divide")
    plain = _Operands({"a": 7, "b": 12})  # a one-operation demo task: every call sees a and b, as before
    assert plain.apply("multiply") == plain.apply("multiply") == "84"
    assert score_answer("The answer is 89.", 89) == 1.0
