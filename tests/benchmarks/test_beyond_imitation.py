"""benchmarks/beyond_imitation.py: the table and plot it renders (on synthetic results: the figures
below are made up), and its smoke configuration run for real on two arms (SFT and the concatenated
GRPO arm) with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .conftest import load_benchmark


def _module() -> ModuleType:
    return load_benchmark("beyond_imitation")


HEADER = {
    "date": "2026-01-01 00:00 UTC",
    "commit": "abc1234",
    "command": "uv run python benchmarks/beyond_imitation.py --smoke",
    "machine": "a CPU, 2 cores",
    "model": "tiny",
    "n_test": 100,
    "budget_min": 15.0,
}


def _write_synthetic(out: Path) -> None:
    seed_dir = out / "seed0"
    sweep = [
        {"steps": 20, "lr": 1e-3, "val": 0.10, "sft_s": 60.0, "name": "s20-lr0.001"},
        {"steps": 40, "lr": 1e-3, "val": 0.20, "val_one": 0.9, "sft_s": 120.0, "name": "s40-lr0.001"},
    ]
    (seed_dir / "sft").mkdir(parents=True)
    record = {"seed": 0, "sweep": sweep, "best": sweep[1], "base_test": 0.0, "best_test": 0.25}
    (seed_dir / "sft" / "result.json").write_text(json.dumps(record | {"process_s": 300.0, "peak_gb": 1.5}))
    for arm, after, joins in (("c", 0.55, False), ("d", 0.45, True)):
        run = seed_dir / arm
        run.mkdir()
        rows = [{"step": 0, "val/reward_mean": 0.25}]
        for step in (1, 2):
            row = {"step": step, "train/elapsed_s": 100.0 * step, "train/step_s": 100.0, "mem/update_peak_gb": 2.0}
            row |= {"train/sequence_tokens": 900.0 if arm == "c" else 500.0, "train/forward_tokens": 1200.0}
            if joins:
                row |= {"train/concat_canonical_joins": 5.0, "train/concat_spliced_joins": 1.0}
            rows.append(row)
        rows.append({"step": 2, "val/reward_mean": after})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "run.json").write_text(json.dumps({"process_s": 400.0, "peak_gb": 2.5}))


def test_the_report_renders_every_arm_the_sweep_and_c_against_a(tmp_path: Path) -> None:
    bench = _module()
    _write_synthetic(tmp_path)
    text = bench.write_report(tmp_path, HEADER)
    assert text.startswith("Generated 2026-01-01 00:00 UTC at commit `abc1234` by `uv run python")
    assert (
        "| a: SFT only (best of the sweep) | 0 | 0.00 | 0.25 | **+0.25** | 2.0 min | 5.0 min | 40 | - | 1.5 GB |"
        in text
    )
    assert (
        "| c: SFT, then GRPO" in text
        and "| 0.25 | 0.55 | **+0.30** | 3.3 min | 6.7 min | 2 | 900, 1200 | 2.5 GB |" in text
    )
    assert "Arm c minus arm a, held-out: seed 0: +0.30." in text
    assert "(left out of its mean): none (no store to count them: a seed 0" in text
    assert "joins between consecutive calls: canonical 10, spliced 2, split 0" in text
    # the sweep's longest point (120 s) trained less than an RL arm with its SFT (200 + 120 s)
    assert "Seed 0: the SFT sweep's longest point trained 2.0 min, the RL arms up to 5.3 min" in text
    assert (
        "| 0 | 40 | 0.001 | 0.20 | 0.90 | 120 s | yes |" in text and "| 0 | 20 | 0.001 | 0.10 | n/a | 60 s |  |" in text
    )
    payload = json.loads((tmp_path / "beyond_imitation.json").read_text())
    curve = next(r["curve"] for r in payload["rows"] if r["arm"] == "c")
    assert curve == [[120.0, 0.25], [320.0, 0.55]]  # the arm's clock starts where its SFT ended
    pytest.importorskip("matplotlib")
    assert (tmp_path / "beyond_imitation.png").stat().st_size > 0


def test_an_arm_that_started_from_another_sweep_point_says_so_and_runs_on_its_clock(tmp_path: Path) -> None:
    bench = _module()
    _write_synthetic(tmp_path)
    record = json.loads((tmp_path / "seed0" / "sft" / "result.json").read_text())
    first = record["sweep"][0]  # --rl-start 20: the shorter point, not the best
    assert bench.start_point(tmp_path, 0, 20) == first and bench.start_point(tmp_path, 0, None) == record["best"]
    with pytest.raises(SystemExit, match="no such point .it swept 20, 40 steps"):
        bench.start_point(tmp_path, 0, 80)
    (tmp_path / "seed0" / "c" / "result.json").write_text(json.dumps({"before": 0.1, "after": 0.55, "start": first}))
    text = bench.write_report(tmp_path, HEADER)
    assert "(per call, episode advantage on every call), from SFT point s20-lr0.001 | 0 |" in text
    assert "d: SFT, then GRPO on concatenated episodes (loss masked to own tokens) | 0 |" in text  # from the best
    payload = json.loads((tmp_path / "beyond_imitation.json").read_text())
    curve = next(r["curve"] for r in payload["rows"] if r["arm"] == "c")
    assert curve == [[60.0, 0.25], [260.0, 0.55]]  # its clock starts where its own SFT point ended


def test_a_sweep_is_read_from_the_command_line() -> None:
    bench = _module()
    assert bench.parse_sweep("40:1e-3, 80:3e-4") == ((40, 1e-3), (80, 3e-4))
    with pytest.raises(SystemExit, match="steps:lr"):
        bench.parse_sweep("40")


@pytest.mark.slow
def test_the_smoke_configuration_runs_sft_and_the_concatenated_arm(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    bench = _module()
    out = tmp_path / "smoke"
    # --rl-start 20: arm d starts from the sweep's first point (20 steps), which arm a keeps on disk
    assert bench.main(["--smoke", "--arms", "a,d", "--seeds", "0", "--rl-start", "20", "--out", str(out)]) == 0
    text = (out / "beyond_imitation.md").read_text()
    assert "| a: SFT only" in text and "| d: SFT, then GRPO on concatenated" in text
    payload = json.loads((out / "beyond_imitation.json").read_text())
    assert {r["arm"] for r in payload["rows"]} == {"a", "d"}
    d = next(r for r in payload["rows"] if r["arm"] == "d")
    assert 1 <= d["steps"] <= 3 and len(d["curve"]) >= 2
    assert (out / "seed0" / "sft" / "best").is_dir() and (out / "seed0" / "sft" / "s20-lr0.001").is_dir()
    assert json.loads((out / "seed0" / "d" / "result.json").read_text())["start"]["steps"] == 20


def test_the_retry_task_is_named_in_the_report_and_its_settings_are_checked(tmp_path: Path) -> None:
    bench = _module()
    _write_synthetic(tmp_path)
    text = bench.write_report(tmp_path, HEADER | {"task": "retry", "fail_rate": 0.5})
    assert "Task: one-operation calculator questions, the tool failing transiently on the first call of 50%" in text
    assert "demonstrations: 300 one-operation questions only, none with a failure" in text
    assert "| validation (flaky tool) | validation (one operation, tool never failing) |" in text
    assert "Task: two-operation calculator questions" in bench.write_report(tmp_path, HEADER)  # the default

    def parsed(*extra: str) -> Any:
        args = ["--model", "smollm2-135m", "--out", str(tmp_path / "x"), *extra]
        return bench.settings(bench.build_parser().parse_args(args))

    retry = parsed("--task", "retry", "--fail-rate", "0.3")
    assert (retry.task, retry.fail_rate, retry.n_train, retry.n_demo_two) == ("retry", 0.3, 100, 0)
    with pytest.raises(SystemExit, match="between 0 and 1"):
        parsed("--task", "retry", "--fail-rate", "1.5")
    assert parsed("--task", "retry", "--two-op-demos", "5").n_demo_two == 5


def test_the_group_size_is_read_checked_and_named_in_the_report(tmp_path: Path) -> None:
    bench = _module()

    def parsed(*extra: str) -> Any:
        args = ["--model", "smollm2-135m", "--out", str(tmp_path / "x"), *extra]
        return bench.settings(bench.build_parser().parse_args(args))

    assert parsed().demo["group_size"] == 8 and parsed().demo["kl_every"] == 4  # the published arms' settings
    wide = parsed("--group-size", "16")
    assert (wide.demo["group_size"], wide.demo["batch_size"]) == (16, 8)
    with pytest.raises(SystemExit, match="at least 2 rollouts"):
        parsed("--group-size", "1")
    _write_synthetic(tmp_path)
    text = bench.write_report(tmp_path, HEADER | {"group_size": 16, "batch_size": 8})
    assert "(8 tasks x 16 rollouts a step)" in text
    assert "rollouts a step" not in bench.write_report(tmp_path, HEADER)  # older runs' headers did not record it
    hot = parsed("--group-size", "16", "--temperature", "1.3")
    assert (hot.demo["group_size"], hot.demo["temperature"]) == (16, 1.3)
    with pytest.raises(SystemExit, match=r"temperature in \(0, 2\]"):
        parsed("--temperature", "0")
    text = bench.write_report(tmp_path, HEADER | {"group_size": 8, "batch_size": 8, "temperature": 1.3})
    assert "(8 tasks x 8 rollouts a step, sampled at temperature 1.3)" in text


def test_calls_counts_what_followed_a_failed_first_call_from_a_real_store(tmp_path: Path) -> None:
    """--calls on a SQLite store holding five retry-task rollouts of one step: a retry with the
    question's operation (solved), one with another operation (not solved), an answer from memory
    after the failure, a question whose tool did not fail, and a turn of two parallel calls."""
    import asyncio

    from lightning_rl import semconv
    from lightning_rl.store import SQLiteStore
    from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task

    def call(start: int, *operations: str) -> Span:
        calls = [
            {"id": f"c{start}{op}", "name": "calculator", "arguments": json.dumps({"operation": op})}
            for op in operations
        ]
        attrs = {semconv.TOOL_CALLS: json.dumps(calls)}
        return Span(
            name=semconv.SPAN_LLM_CALL, rollout_id="", attempt_id="", start_ns=start, end_ns=start + 1, attributes=attrs
        )

    add = {"operation": "add", "failures": 1}
    rollouts = {  # id: (task input, spans out of time order, reward)
        "same": (add, [call(300), call(200, "add"), call(100, "add")], 1.0),
        "other": (add, [call(300), call(100, "add"), call(200, "subtract")], 0.0),
        "memory": (add, [call(100, "add"), call(200)], 1.0),
        "fine": ({"operation": "add", "failures": 0}, [call(100, "add"), call(200)], 1.0),
        # two parallel calls in one turn: one calling turn, so no call again
        "parallel": (add, [call(100, "add", "subtract"), call(200)], 0.0),
    }

    async def fill() -> None:
        store = SQLiteStore(tmp_path / "store.sqlite")
        await store.enqueue([RolloutRequest(id=r, task=Task(input=inp)) for r, (inp, _, _) in rollouts.items()])
        for _ in rollouts:
            (claim,) = await store.claim("w")
            _, spans, reward = rollouts[claim.rollout.id]
            ids = {"rollout_id": claim.rollout.id, "attempt_id": claim.attempt.id}
            await store.add_spans([s.model_copy(update=ids) for s in spans])
            await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=reward)
        await store.close()

    asyncio.run(fill())
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward_mean": 0.75}) + "\n")
    text = _module().calls_report(tmp_path)
    assert "| 1 | 5 | 0 | 3 | 2 | 0 | 4 | 1 | 1 | 2 | 0.750 |" in text
    assert (
        "4 rollouts met a failed first call; 1 called again with the question's operation, 1 with another; "
        "2 were solved" in text
    )
