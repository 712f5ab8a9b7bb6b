"""The flaky-tool task of issue 41: splits, the transient failure and what the demonstrations show."""

from __future__ import annotations

import pytest

from lightning_rl.demo.calculator import TransientToolError, _Operands  # pyright: ignore[reportPrivateUsage]
from lightning_rl.demo.retry import retry_splits, with_failures
from lightning_rl.demo.two_step import make_chained_tasks, one_step_demonstrations


def test_the_tool_fails_as_often_as_the_task_says_then_answers_the_same_call() -> None:
    task = {"operands": [7, 12], "failures": 1}
    tool = _Operands(task)
    with pytest.raises(TransientToolError, match="call it again"):
        tool.apply("multiply")
    assert tool.apply("multiply") == "84"  # the failed call used no number: the retry is the first call
    twice = _Operands({"operands": [3, 4], "failures": 2})
    for _ in range(2):
        with pytest.raises(TransientToolError):
            twice.apply("divide")  # fails before it looks at the arguments, as a busy service does
    with pytest.raises(ValueError, match="unknown operation"):
        twice.apply("divide")
    assert not issubclass(TransientToolError, ValueError)  # the agent emits no tool_error signal for it
    assert _Operands({"operands": [7, 12]}).apply("add") == "19"  # no failures: as before


def test_splits_are_disjoint_deterministic_and_fail_at_the_rate_asked() -> None:
    split = retry_splits(3, n_demo=200, n_train=100, n_val=50, n_test=200, fail_rate=0.5)
    assert retry_splits(3, n_demo=200, n_train=100, n_val=50, n_test=200, fail_rate=0.5) == split
    questions = [t.input["question"] for t in split.demo + split.train + split.val + split.test]
    assert len(questions) == len(set(questions)) == 550
    assert all(len(t.input["operands"]) == 2 for t in split.demo + split.train + split.test)
    assert all(t.input.get("failures", 0) == 0 for t in split.demo) and split.demo_two == []
    failing = [t for t in split.train + split.val + split.test if t.input["failures"] == 1]
    assert 0.4 < len(failing) / 350 < 0.6 and all(t.id.endswith("-f") for t in failing)
    # val_one: the validation questions with a tool that never fails
    assert [t.input["question"] for t in split.val_one] == [t.input["question"] for t in split.val]
    assert all(t.input["failures"] == 0 for t in split.val_one)
    for demo in one_step_demonstrations(split.demo, seed=3):  # no demonstration shows an error
        assert all("error" not in str(m.get("content", "")) for m in demo.messages if m["role"] == "tool")
    # two-operation demonstrations show a call after a tool result, never after an error
    mixed = retry_splits(3, n_demo=200, n_train=100, n_val=50, n_test=200, n_demo_two=5)
    assert (mixed.train, mixed.test, mixed.demo) == (split.train, split.test, split.demo)
    assert len(mixed.demo_two) == 5 and all(len(t.input["operands"]) == 3 for t in mixed.demo_two)
    with pytest.raises(ValueError, match="distinct"):
        retry_splits(0, n_demo=300, n_train=300)
    with pytest.raises(ValueError, match="fail_rate"):
        with_failures(make_chained_tasks(2, operations=1, seed=0), fail_rate=-0.1, seed=0)
