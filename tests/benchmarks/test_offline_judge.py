"""benchmarks/offline_judge.py without SmolLM2: its groups, its summary and its report, and a whole run
against the scripted judge (``--base-url``), both modes, pasted into a doc's block."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from lightning_rl.testing.fake_judge import FakeJudge

from .conftest import load_benchmark


def _module() -> ModuleType:
    return load_benchmark("offline_judge")


bench = _module()


def _knows_the_answer(text: str) -> float:
    """The scripted judge: right when the last 'answer is' / 'it is' number is the task's gold answer."""
    gold = text.split('"answer": ', 1)[1].split("}", 1)[0].split(",", 1)[0]
    final = text.rsplit("  assistant: ", 1)[1].split("\n", 1)[0]
    return 0.9 if final.rstrip(".").split()[-1] == gold else 0.2


def test_groups_hold_right_and_wrong_trajectories_rendered_like_rollouts() -> None:
    groups = bench.build_groups(3, 4, seed=1)
    assert len(groups) == 3 and all(len(g) == 4 for g in groups)
    assert all(sum(t.right for t in g) == 2 for g in groups)
    for group in groups:
        for t in group:
            assert t.text.startswith('task: {"question": ') and t.text.endswith("outcome: succeeded")
            assert _knows_the_answer(t.text) == (0.9 if t.right else 0.2)
    tools = [("tool call:" in t.text) for g in groups for t in g if not t.right]
    assert any(tools) and not all(tools)  # wrong ones: misreported after the tool, or from memory
    assert bench.build_groups(3, 4, seed=1) == groups  # deterministic in the seed
    hidden = bench.build_groups(2, 3, seed=1, hide_answer=True)
    assert all('"answer"' not in t.text for g in hidden for t in g)
    assert [sum(t.right for t in g) for g in hidden] == [1, 1]
    with pytest.raises(ValueError, match="group-size"):
        bench.build_groups(1, 1, seed=0)


def test_the_summary_counts_valid_scores_means_and_the_ranking() -> None:
    r, w = bench.Trajectory("r", True), bench.Trajectory("w", False)
    groups = [[r, w, w], [r, r, w], [r, w]]
    summary = bench.summarize(groups, [[0.8, 0.2, 0.8], [0.6, 0.4, 0.5], None])
    assert summary["valid"] == 6 and summary["total"] == 8 and summary["valid_rate"] == 0.75
    assert (summary["groups_scored"], summary["groups"]) == (2, 3)
    assert summary["mean_right"] == pytest.approx((0.8 + 0.6 + 0.4) / 3)
    assert summary["mean_wrong"] == pytest.approx((0.2 + 0.8 + 0.5) / 3)
    # pairs: (0.8 vs 0.2) win, (0.8 vs 0.8) tie, (0.6 vs 0.5) win, (0.4 vs 0.5) loss
    assert summary["pairwise"] == pytest.approx(2.5 / 4)
    empty = bench.summarize(groups, [None, None, None])
    assert empty["valid"] == 0 and math.isnan(empty["pairwise"]) and math.isnan(empty["mean_right"])


async def test_a_run_against_the_scripted_judge_reports_both_modes_and_pastes(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- offline-judge:begin -->\nstale output\n<!-- offline-judge:end -->\nafter\n")
    fake = FakeJudge(_knows_the_answer, model="judge-x")
    async with fake.running() as url:
        argv = ["--groups", "3", "--group-size", "4", "--base-url", url, "--model", "judge-x"]
        argv += ["--json", str(tmp_path / "new" / "scores.json")]  # a folder that does not exist yet
        text = await bench.run(bench.parse_args(argv), argv)
    lines = text.splitlines()
    assert lines[0].startswith("Generated ") and "benchmarks/offline_judge.py --groups 3" in lines[0]
    assert "`judge-x` at http://127.0.0.1:" in text
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith(("| logprobs", "| group"))}
    assert set(rows) == {"logprobs", "group"}
    # the scripted scores come back exactly; logprobs: one call per distinct trajectory, group: one per group
    assert "| 12/12 (100%) | 3/3 | 0.90 | 0.20 | 1.00 |" in rows["logprobs"]
    assert "| 12/12 (100%) | 3/3 | 0.90 | 0.20 | 1.00 |" in rows["group"]
    distinct = sum(len({t.text for t in g}) for g in bench.build_groups(3, 4, seed=0))
    assert distinct < 12  # the two right answers of a group read the same: asked once
    assert rows["logprobs"].split(" | ")[7] == str(distinct) and rows["group"].split(" | ")[7] == "3"
    raw = json.loads((tmp_path / "new" / "scores.json").read_text())
    assert len(raw["groups"]) == 3 and raw["errors"] == {"logprobs": {}, "group": {}}
    first = raw["groups"][0]
    assert (
        [s > 0.5 for s in first["scores"]["logprobs"]] == first["right"] == [s > 0.5 for s in first["scores"]["group"]]
    )
    bench.paste_block(doc, text, bench.BLOCK)
    pasted = doc.read_text()
    assert pasted.startswith("before\n<!-- offline-judge:begin -->\nGenerated ") and pasted.endswith(
        "<!-- offline-judge:end -->\nafter\n"
    )
    assert "stale output" not in pasted


def test_a_failing_mode_is_reported_not_raised() -> None:
    r, w = bench.Trajectory("r", True), bench.Trajectory("w", False)
    stats = bench.JudgeStats(calls=4, failed_groups=2)
    stats.errors.update({"malformed": 3, "timeout": 1})
    result = bench.ModeResult("group", [None, None], stats, 12.5, bench.summarize([[r, w], [r, w]], [None, None]))
    text = bench.report([result], header="Generated now.", groups=2, size=2, judge="j", hide_answer=False)
    row = next(line for line in text.splitlines() if line.startswith("| group"))
    assert "| 0/4 (0%) | 0/2 | - | - | - |" in row and "| malformed 3, timeout 1 | 12.5 |" in row


def test_bad_modes_are_refused() -> None:
    with pytest.raises(SystemExit):
        bench.parse_args(["--modes", "pairs"])
