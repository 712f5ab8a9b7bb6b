"""Does a judge's reward teach as well as the exact answer? GRPO on the demo agent, both ways, per seed.

The sanity check of ``lightning_rl.rewards`` (issue 43): a scripted judge that knows the gold answer
(``lightning_rl.testing.FakeJudge``, served over HTTP from this process) scores each group's rendered
trajectories; GRPO trained on those scores should gain on held-out tasks as GRPO trained on the
agent's exact-match reward does, within the seed-to-seed noise. Per seed, two runs of
``lightning-rl train`` in fresh processes:

- ``exact``: ``examples/calculator/grpo.toml`` (the demo as a run file: the agent's exact-match reward);
- ``judge``: ``examples/calculator/grpo_judge.toml`` with ``algorithm.judge`` pointed at the scripted
  judge: the same run, rewarded by judge calls only. It starts from the exact run's warm start (the
  run file reuses a finished one), so each seed's pair differs only in the reward.

The held-out score of both is the agent's own exact-match reward on unseen tasks (greedy), so the two
columns compare like with like. Output: ``learning.py``'s table per arm (date, commit, command,
machine), the gains side by side, and the judge's cost from ``metrics.jsonl``, to ``<out>/judge_learning.md``
and stdout; ``--doc FILE`` pastes it between ``<!-- judge-learning:begin -->`` and ``<!-- judge-learning:end -->``.

    uv run python benchmarks/judge_learning.py --seeds 0-2 --threads 1
    uv run python benchmarks/judge_learning.py --seeds 0-2 --threads 1 --doc docs/rewards.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import cpu_name, git_commit, parse_seeds, paste_block, per_step
from learning import RunResult, held_out_curve, median_metric, table

from lightning_rl.demo.calculator import score_answer
from lightning_rl.testing.fake_judge import FakeJudge

ROOT = Path(__file__).resolve().parent.parent
EXACT = ROOT / "examples" / "calculator" / "grpo.toml"
JUDGED = ROOT / "examples" / "calculator" / "grpo_judge.toml"
BLOCK = "judge-learning"
JUDGE_MODEL = "gold-judge"
_ANSWER = re.compile(r'"answer": (-?\d+)')


def gold_score(trajectory: str) -> float:
    """The scripted judge's score of one rendered trajectory: 1 if its last model call answered (no tool
    call) and the answer's last integer is the task's gold answer (``"answer"`` in the task input)."""
    gold = _ANSWER.search(trajectory.split("\n", 1)[0])
    last = trajectory.rfind("[model call")
    if gold is None or last < 0:
        return 0.0
    final = trajectory[last:].split("\noutcome:", 1)[0]
    if "\n  tool call:" in final or "  assistant: " not in final:
        return 0.0  # ran out of turns on a tool call: the agent gave no answer
    # the last "assistant:" line is the call's answer (earlier ones are resent messages of its prompt)
    return score_answer(final.rsplit("  assistant: ", 1)[1], int(gold.group(1)))


def train_command(run_file: Path, seed: int, run_dir: Path, extra: list[str]) -> list[str]:
    exe = Path(sys.executable).parent / "lightning-rl"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "lightning_rl.cli"]
    sets = [f"seed={seed}", f"run_dir={run_dir}", "algorithm.progress=false", *extra]
    return [*base, "train", str(run_file), *[a for s in sets for a in ("--set", s)]]


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run (its final held-out row and checkpoint are written)."""
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and (run_dir / "checkpoints" / "latest").exists() and len(held_out_curve(metrics)) >= 2


def run_arm(
    arm: str, seed: int, out: Path, threads: int | None, judge_url: str, shared: int | None, reuse: bool
) -> RunResult:
    """One ``lightning-rl train`` run. ``shared``: start from that seed's exact-run warm start and train
    on that seed's task split (only the RL phase then varies with ``seed``)."""
    run_dir = out / f"{arm}-seed{seed}"
    if reuse and finished(run_dir):
        print(f"reusing the finished run in {run_dir}", flush=True)
        measured = run_dir / "wall.json"
        if measured.exists():
            data = json.loads(measured.read_text())
            return result_of(run_dir, seed, wall=data["wall_s"], peak_rss_mb=data["peak_rss_mb"])
        # started elsewhere: wall time from the run's first and last files; its memory was not measured
        wall = (run_dir / "checkpoints" / "latest").stat().st_mtime - (run_dir / "train_config.json").stat().st_mtime
        return result_of(run_dir, seed, wall=wall, peak_rss_mb=0.0)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    extra: list[str] = []
    run_file = EXACT
    if arm == "judge":
        run_file = JUDGED
        extra = [f"algorithm.judge.base_url={judge_url}", f"algorithm.judge.model={JUDGE_MODEL}"]
    warm_seed = seed if shared is None else shared
    warm = out / f"exact-seed{warm_seed}" / "warm_start"
    if (arm == "judge" or warm_seed != seed) and warm.is_dir():
        # the same starting weights as the exact run: the pair differs only in the reward
        shutil.copytree(warm, run_dir / "warm_start")
    if shared is not None:
        for key in ("train_tasks", "val_tasks"):
            extra.append(f'{key}={{"function": "demo_calculator:{key}", "seed": {shared}}}')
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    log_path = out / f"{run_dir.name}.log"
    started = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            train_command(run_file, seed, run_dir, extra), env=env, stdout=log, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{arm} seed {seed} failed; see {log_path}")
    (run_dir / "wall.json").write_text(json.dumps({"wall_s": wall, "peak_rss_mb": usage.ru_maxrss / 1024}))
    return result_of(run_dir, seed, wall=wall, peak_rss_mb=usage.ru_maxrss / 1024)


def result_of(run_dir: Path, seed: int, *, wall: float, peak_rss_mb: float) -> RunResult:
    metrics = run_dir / "metrics.jsonl"
    curve = held_out_curve(metrics)
    if len(curve) < 2:
        raise SystemExit(f"{run_dir}: {len(curve)} held-out rows in {metrics}; expected before and after")
    return RunResult(
        seed,
        0,
        curve[0][1],
        curve[-1][1],
        wall,
        curve,
        peak_rss_mb=peak_rss_mb,
        rollout_tokens_per_s=median_metric(metrics, "train/rollout_tokens_per_s"),
        update_tokens_per_s=median_metric(metrics, "train/update_tokens_per_s"),
    )


def judge_costs(out: Path, seeds: list[int]) -> str:
    """One line of the judge's cost, summed over the judge runs' steps (``train/judge_*`` metrics)."""
    totals: dict[str, float] = {}
    keys = ("calls", "retries", "prompt_tokens", "completion_tokens", "failed_groups", "excluded_rollouts", "s")
    for seed in seeds:
        metrics = out / f"judge-seed{seed}" / "metrics.jsonl"
        for key in keys:
            totals[key] = totals.get(key, 0.0) + sum(per_step(metrics, f"train/judge_{key}"))
    n = len(seeds)
    # the agent still emits its exact-match reward in the judge runs: a faithful judge matches it step by step
    gaps = [
        abs(j - r)
        for seed in seeds
        for j, r in zip(
            per_step(out / f"judge-seed{seed}" / "metrics.jsonl", "train/judge_score_mean"),
            per_step(out / f"judge-seed{seed}" / "metrics.jsonl", "train/reward_mean"),
            strict=True,
        )
    ]
    gap = statistics.fmean(gaps) if gaps else float("nan")
    agreement = f"Judge score vs the agent's own exact-match reward, per step: mean |difference| {gap:.3f}. "
    return agreement + (
        f"Judge cost per run (mean of {n}): {totals['calls'] / n:.0f} calls ({totals['retries'] / n:.0f} retries), "
        f"{totals['prompt_tokens'] / n:,.0f} prompt + {totals['completion_tokens'] / n:,.0f} completion tokens "
        f"(the scripted judge counts 4 characters a token), {totals['failed_groups'] / n:.0f} groups failed "
        f"({totals['excluded_rollouts'] / n:.0f} rollouts left out), {totals['s'] / n:.1f} s judging."
    )


def comparison(exact: list[RunResult], judged: list[RunResult]) -> str:
    lines = ["| seed | exact-match gain | judge gain | judge - exact |", "|---:|---:|---:|---:|"]
    for e, j in zip(exact, judged, strict=True):
        lines.append(f"| {e.seed} | {e.gain:+.2f} | {j.gain:+.2f} | {j.gain - e.gain:+.2f} |")
    ge, gj = [r.gain for r in exact], [r.gain for r in judged]
    diffs = [j - e for e, j in zip(ge, gj, strict=True)]
    spread = statistics.stdev(ge) if len(ge) > 1 else 0.0
    lines += [
        "",
        f"Mean gain: exact-match **{statistics.fmean(ge):+.2f}**, judge **{statistics.fmean(gj):+.2f}**; "
        f"mean paired difference {statistics.fmean(diffs):+.2f} (seed-to-seed std of the exact gains: {spread:.2f}).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0-2", help="seeds to run: 0-2, or 0,2,5")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of each run (OMP_NUM_THREADS)")
    ap.add_argument("--out", default="runs/judge_learning", help="folder for the runs and the table")
    ap.add_argument("--doc", default=None, help="replace the judge-learning block of this file with the output")
    ap.add_argument("--paste", default=None, help="run nothing: paste this earlier judge_learning.md into --doc")
    ap.add_argument(
        "--shared-warm-start",
        action="store_true",
        help="every run starts from the first seed's warm start and task split; the seeds vary the RL phase only "
        "(one warm start instead of one per seed: what fits a busy machine)",
    )
    ap.add_argument("--reuse", action="store_true", help="keep runs of --out that already finished")
    args = ap.parse_args(argv)
    if args.paste:
        if not args.doc:
            raise SystemExit("--paste needs --doc FILE")
        paste_block(Path(args.doc), Path(args.paste).read_text(), BLOCK)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(args.seeds)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    header = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "command": f"uv run python benchmarks/judge_learning.py {argv_text}".strip(),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "threads": str(args.threads) if args.threads else "default",
    }
    judge = FakeJudge(gold_score, model=JUDGE_MODEL)
    exact: list[RunResult] = []
    judged: list[RunResult] = []
    with judge.serving_in_thread() as url:
        for seed in seeds:
            for arm, results in (("exact", exact), ("judge", judged)):
                shared = seeds[0] if args.shared_warm_start else None
                r = run_arm(arm, seed, out, args.threads, url, shared, args.reuse)
                results.append(r)
                line = f"{arm} seed {seed}: {r.before:.2f} -> {r.after:.2f} ({r.gain:+.2f}) in {r.wall_s:.0f} s"
                print(line, flush=True)
    text = "\n".join(
        [
            "**Exact-match reward** (`examples/calculator/grpo.toml`):",
            "",
            table(exact, header),
            "**Judge reward** (`examples/calculator/grpo_judge.toml`, scripted judge that knows the gold answer):",
            "",
            table(judged, header),
            comparison(exact, judged),
            "",
            judge_costs(out, seeds),
            "",
        ]
    )
    print(text)
    (out / "judge_learning.md").write_text(text)
    payload: dict[str, Any] = {
        **header,
        "exact": [{**r.__dict__, "gain": r.gain} for r in exact],
        "judge": [{**r.__dict__, "gain": r.gain} for r in judged],
        "judge_requests": len(judge.requests),
    }
    (out / "judge_learning.json").write_text(json.dumps(payload, indent=2))
    if args.doc:
        paste_block(Path(args.doc), text, BLOCK)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
