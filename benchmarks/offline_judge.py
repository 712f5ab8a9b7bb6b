"""Can SmolLM2-135M judge offline? Its scores of calculator answers known to be right or wrong, per mode.

The offline check of ``lightning_rl.rewards`` (issue 43): ``--groups`` groups of ``--group-size``
calculator-demo trajectories (``lightning_rl.demo.calculator`` tasks), half of each group right (the
calculator tool called and its result reported) and half wrong (off by 1 to 9: half of them
reported after a correct tool call, half answered from memory without one, the demo's warm-start
failure). Each is rendered from spans exactly as the trainer renders a rollout for the judge
(``lightning_rl.algorithms.apo_render``), and judged with the rubric of
``examples/calculator/grpo_judge.toml`` (the task input shows the gold answer, as in the demo;
``--hide-answer`` removes it and uses the default rubric), in each of ``--modes``:

- ``logprobs``: one call per trajectory, one digit read from the top logprobs (the mode made for
  small judges);
- ``group``: the whole group in one call, JSON scores, with ``structured_output="off"``, a short
  timeout and one retry, for contrast.

Printed per mode: the share of trajectories that got a valid score (a failed group is left out, as
in training), the mean score of the right and the wrong ones, the pairwise ranking accuracy (share
of (right, wrong) pairs of one scored group with the right one scored higher; ties count half, 0.5
is chance), the score's spread, and the calls, tokens, errors and seconds. Headed by date, commit,
command and machine; ``--doc FILE`` pastes it between ``<!-- offline-judge:begin -->`` and
``<!-- offline-judge:end -->``.

By default the judge is SmolLM2-135M-Instruct behind the gateway, served in this process on
127.0.0.1 (needs the ``smollm2`` extra; the model is converted once and cached). ``--base-url`` and
``--model`` judge with any running OpenAI-compatible server instead (the tests use the scripted judge).

    uv run python benchmarks/offline_judge.py --groups 8 --threads 2
    uv run python benchmarks/offline_judge.py --groups 8 --threads 2 --doc docs/rewards.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import platform
import random
import statistics
import sys
import time
import tomllib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import generated_line, paste_block

from lightning_rl import semconv
from lightning_rl.algorithms.apo_render import render_rollout
from lightning_rl.demo.calculator import SYSTEM_PROMPT, after_tool_call, calculator, make_tasks, tool_call_text
from lightning_rl.rewards import DEFAULT_RUBRIC, GroupJudge, JudgeConfig, JudgeStats
from lightning_rl.types import Rollout, RolloutStatus, Span, Task

__all__ = [
    "Trajectory",
    "ModeResult",
    "render_trajectory",
    "build_groups",
    "summarize",
    "judge_config",
    "judge_mode",
    "report",
    "raw_scores",
    "main",
]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "calculator" / "grpo_judge.toml"
BLOCK = "offline-judge"
MODEL = "smollm2-135m"
MODES = ("logprobs", "group")


@dataclass(frozen=True)
class Trajectory:
    """One rendered calculator trajectory and whether its final answer is right."""

    text: str
    right: bool


@dataclass
class ModeResult:
    """What judging every group in one mode gave."""

    mode: str
    scores: list[list[float] | None]
    stats: JudgeStats
    seconds: float
    summary: dict[str, float] = field(default_factory=dict[str, float])


def _span(t: int, messages: list[dict[str, Any]], text: str, calls: list[dict[str, Any]]) -> Span:
    attrs: dict[str, Any] = {
        semconv.GEN_AI_INPUT_MESSAGES: json.dumps(messages),
        semconv.RESPONSE_TEXT: text,
        semconv.TOOL_CALLS: json.dumps(calls),
    }
    return Span(name=semconv.SPAN_LLM_CALL, start_ns=t, end_ns=t + 1, attributes=attrs, rollout_id="r", attempt_id="a")


def render_trajectory(task: Task, final: int, *, tool: bool) -> str:
    """The transcript the judge reads of the demo agent answering ``final`` to ``task``: with ``tool``,
    a calculator call with the task's operation, its (true) result, then the answer; without, the answer
    from memory in the first turn. The spans hold what the gateway records of the agent's calls."""
    data: dict[str, Any] = task.input
    base: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": data["question"]},
    ]
    if tool:
        arguments = json.dumps({"operation": data["operation"]})
        call = {"id": "call_0", "name": "calculator", "arguments": arguments}
        result = int(calculator(str(data["operation"]), int(data["a"]), int(data["b"])))
        spans = [
            _span(10, base, tool_call_text(arguments), [call]),
            _span(20, after_tool_call(base, arguments, result), f"The answer is {final}.", []),
        ]
    else:
        spans = [_span(10, base, f"I think it is {final}.", [])]
    return render_rollout(Rollout(task=task, status=RolloutStatus.SUCCEEDED), spans)


def build_groups(n: int, size: int, *, seed: int, hide_answer: bool = False) -> list[list[Trajectory]]:
    """``n`` groups of ``size`` trajectories (distinct tasks), ``size // 2`` right and the rest wrong, in a
    random order. A wrong answer is off by 1 to 9; wrong ones alternate between reported after the tool
    call and answered from memory."""
    if size < 2:
        raise ValueError("--group-size must be >= 2: a group needs a right and a wrong trajectory")
    rng = random.Random(seed)
    groups: list[list[Trajectory]] = []
    for task in make_tasks(n, seed=seed):
        answer = int(task.input["answer"])
        if hide_answer:
            task = Task(id=task.id, input={k: v for k, v in task.input.items() if k != "answer"})
        right = [Trajectory(render_trajectory(task, answer, tool=True), True) for _ in range(size // 2)]
        wrong: list[Trajectory] = []
        for i in range(size - size // 2):
            final = answer + rng.choice([-1, 1]) * rng.randint(1, 9)
            wrong.append(Trajectory(render_trajectory(task, final, tool=i % 2 == 0), False))
        group = right + wrong
        rng.shuffle(group)
        groups.append(group)
    return groups


def summarize(groups: Sequence[Sequence[Trajectory]], scores: Sequence[Sequence[float] | None]) -> dict[str, float]:
    """Valid-score rate, mean score of right and wrong trajectories, pairwise ranking accuracy (right
    above wrong within a scored group; ties half) and the scores' standard deviation. NaN where no
    trajectory was scored."""
    right: list[float] = []
    wrong: list[float] = []
    pairs = wins = 0.0
    total = sum(len(g) for g in groups)
    scored_groups = 0
    for group, group_scores in zip(groups, scores, strict=True):
        if group_scores is None:
            continue
        scored_groups += 1
        for trajectory, score in zip(group, group_scores, strict=True):
            (right if trajectory.right else wrong).append(score)
        good = [s for t, s in zip(group, group_scores, strict=True) if t.right]
        bad = [s for t, s in zip(group, group_scores, strict=True) if not t.right]
        for g in good:
            for b in bad:
                pairs += 1
                wins += 1.0 if g > b else 0.5 if g == b else 0.0
    both = right + wrong
    return {
        "valid_rate": len(both) / total if total else math.nan,
        "valid": float(len(both)),
        "total": float(total),
        "groups_scored": float(scored_groups),
        "groups": float(len(groups)),
        "mean_right": statistics.fmean(right) if right else math.nan,
        "mean_wrong": statistics.fmean(wrong) if wrong else math.nan,
        "pairwise": wins / pairs if pairs else math.nan,
        "std": statistics.pstdev(both) if len(both) > 1 else math.nan,
    }


def judge_config(mode: str, base_url: str, model: str, rubric: str, args: argparse.Namespace) -> JudgeConfig:
    """The judge of one mode: ``logprobs`` with the defaults (retries included), ``group`` with plain
    JSON, ``--group-timeout`` and one retry (a small model rarely writes valid JSON; this bounds the wait)."""
    common: dict[str, Any] = {
        "model": model,
        "base_url": base_url,
        "rubric": rubric,
        "cache": False,
        "concurrency": args.concurrency,
        "seed": args.seed,
        "backoff_s": 0.1,
    }
    if mode == "logprobs":
        return JudgeConfig(scoring="logprobs", timeout_s=args.timeout, **common)
    return JudgeConfig(
        scoring="group",
        structured_output="off",
        timeout_s=args.group_timeout,
        max_retries=1,
        max_tokens=args.group_max_tokens,
        **common,
    )


async def judge_mode(config: JudgeConfig, groups: Sequence[Sequence[Trajectory]]) -> ModeResult:
    """Judge every group in ``config.scoring`` mode; time it and summarize the scores."""
    judge = GroupJudge(config)
    started = time.perf_counter()
    scores = await judge.score_groups([[t.text for t in g] for g in groups])
    result = ModeResult(config.scoring, scores, judge.stats, time.perf_counter() - started)
    result.summary = summarize(groups, scores)
    return result


def _num(value: float, digits: int = 2) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def report(results: Sequence[ModeResult], *, header: str, groups: int, size: int, judge: str, hide_answer: bool) -> str:
    """The markdown the script prints (and pastes with ``--doc``)."""
    right = size // 2
    shown = (
        "the default rubric; the gold answer is not shown"
        if hide_answer
        else ("the rubric of `examples/calculator/grpo_judge.toml`; the task input shows the gold answer")
    )
    lines = [
        header,
        "",
        f"Judge: {judge}. {groups} groups of {size} calculator trajectories ({right} right: tool called and its "
        f"result reported; {size - right} wrong: off by 1 to 9, reported after the tool call or answered from "
        f"memory), rendered as the trainer renders rollouts; {shown}.",
        "",
        "| mode | valid scores | groups scored | mean score right | mean score wrong | right above wrong "
        "| score std | calls | prompt tokens | completion tokens | errors | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        s, st = r.summary, r.stats
        errors = ", ".join(f"{k} {v}" for k, v in sorted(st.errors.items())) or "none"
        lines.append(
            f"| {r.mode} | {int(s['valid'])}/{int(s['total'])} ({_num(100 * s['valid_rate'], 0)}%) "
            f"| {int(s['groups_scored'])}/{int(s['groups'])} | {_num(s['mean_right'])} | {_num(s['mean_wrong'])} "
            f"| {_num(s['pairwise'])} | {_num(s['std'])} | {st.calls} | {st.prompt_tokens:,} "
            f"| {st.completion_tokens:,} | {errors} | {r.seconds:.1f} |"
        )
    lines += [
        "",
        "Right above wrong: the share of (right, wrong) pairs of one scored group in which the right "
        "trajectory scored higher (ties count half; 0.5 is chance, 1.0 a perfect ranking). A group that "
        "could not be scored is left out, as in training.",
        "",
    ]
    return "\n".join(lines)


def example_rubric() -> str:
    """The rubric of ``examples/calculator/grpo_judge.toml``."""
    return str(tomllib.loads(EXAMPLE.read_text())["algorithm"]["judge"]["rubric"]).strip()


@contextlib.asynccontextmanager
async def smollm2_gateway(threads: int, batch: int) -> AsyncGenerator[tuple[str, str]]:
    """SmolLM2-135M-Instruct behind the gateway, served in this process on 127.0.0.1: (base URL, model name)."""
    import torch

    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.gateway import create_gateway_app
    from lightning_rl.gateway.server import running_gateway

    torch.set_num_threads(threads)
    with TransformersEngine.from_pretrained(MODEL, max_batch_size=batch) as engine:
        async with running_gateway(create_gateway_app(engine)) as url:
            yield f"{url}/v1", engine.model_name


def raw_scores(groups: Sequence[Sequence[Trajectory]], results: Sequence[ModeResult]) -> dict[str, Any]:
    """Every trajectory's label and score per mode (None: its group was left out), for ``--json``."""
    return {
        "groups": [
            {
                "right": [t.right for t in group],
                "scores": {r.mode: r.scores[i] for r in results},
            }
            for i, group in enumerate(groups)
        ],
        "summary": {r.mode: r.summary for r in results},
        "errors": {r.mode: dict(r.stats.errors) for r in results},
    }


async def run(args: argparse.Namespace, argv: list[str] | None) -> str:
    groups = build_groups(args.groups, args.group_size, seed=args.seed, hide_answer=args.hide_answer)
    rubric = DEFAULT_RUBRIC if args.hide_answer else example_rubric()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: list[ModeResult] = []
    async with contextlib.AsyncExitStack() as stack:
        if args.base_url:
            base_url, model = args.base_url, args.model or MODEL
            judge = f"`{model}` at {base_url}"
        else:
            started = time.perf_counter()
            base_url, model = await stack.enter_async_context(smollm2_gateway(args.threads, args.concurrency))
            judge = f"SmolLM2-135M-Instruct (`{model}`) through the gateway, in process on CPU"
            print(f"gateway with {model} ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        for mode in modes:
            config = judge_config(mode, base_url, model, rubric, args)
            result = await judge_mode(config, groups)
            print(f"{mode}: {result.summary} in {result.seconds:.1f} s", file=sys.stderr, flush=True)
            results.append(result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(raw_scores(groups, results), indent=1) + "\n")
    threads = "" if args.base_url else f"; torch threads: {args.threads}"
    machine = f"Python {platform.python_version()}{threads}"
    header = generated_line("offline_judge.py", argv, machine)
    return report(
        results,
        header=header,
        groups=args.groups,
        size=args.group_size,
        judge=judge,
        hide_answer=args.hide_answer,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=8, help="groups (one calculator task each)")
    ap.add_argument("--group-size", type=int, default=4, help="trajectories per group, half right")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: logprobs, group")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the in-process SmolLM2")
    ap.add_argument("--concurrency", type=int, default=4, help="judge requests in flight")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per logprobs-mode request")
    ap.add_argument("--group-timeout", type=float, default=60.0, help="seconds per group-mode request")
    ap.add_argument("--group-max-tokens", type=int, default=256, help="most tokens of a group-mode answer")
    ap.add_argument("--hide-answer", action="store_true", help="take the gold answer out of the task input")
    ap.add_argument("--base-url", default=None, help="judge with this running server (…/v1) instead of SmolLM2")
    ap.add_argument("--model", default=None, help="the model name at --base-url")
    ap.add_argument("--json", default=None, help="also write every trajectory's label and scores to this file")
    ap.add_argument("--doc", default=None, help="paste the output into this file's offline-judge block")
    args = ap.parse_args(argv)
    bad = [m for m in args.modes.split(",") if m.strip() and m.strip() not in MODES]
    if bad:
        ap.error(f"--modes: unknown {', '.join(bad)}; use logprobs, group or both")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = asyncio.run(run(args, argv))
    print(text)
    if args.doc:
        paste_block(Path(args.doc), text, BLOCK)
        print(f"pasted into {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
