"""Are the candidates of an APO round evaluated in parallel? Wall time of N candidates vs one.

An agent that sleeps ``--sleep`` seconds (asyncio) and never calls a model runs on ``--tasks``
tasks through the real APO path: a SQLite store in a temporary folder, the gateway (in front of the
scripted fake upstream, which this agent never calls), the in-process runner with ``--concurrency``
slots, ``APO.evaluate`` enqueueing every rollout of the round at once and scoring them. Per repeat
it times one candidate on the tasks, then ``--candidates`` candidates on the same tasks; it reports
the medians, their ratio (1.0 = perfect overlap, ``--candidates`` = one after another), and how
the rollouts of the candidates overlapped in the store's own attempt records.

    uv run python benchmarks/apo_parallel.py                 # the figure in benchmarks/README.md
    uv run python benchmarks/apo_parallel.py --candidates 8 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time

from _common import git_commit

from lightning_rl.agent import LLM
from lightning_rl.algorithms.apo import APO, APOConfig, prompt_template
from lightning_rl.gateway import running_gateway
from lightning_rl.testing import FakeUpstream
from lightning_rl.types import Task


async def _main(args: argparse.Namespace) -> float:
    sleep_s: float = args.sleep

    async def sleeping_agent(task: object, llm: LLM) -> float:
        await asyncio.sleep(sleep_s)
        return float(len(prompt_template("system")))

    tasks = [Task(input={"i": i}, id=f"t{i}") for i in range(args.tasks)]
    with tempfile.TemporaryDirectory() as tmp:
        async with running_gateway(FakeUpstream(model="fake-model").app) as upstream:
            cfg = APOConfig(concurrency=args.concurrency, llm_base_url=f"{upstream}/v1", run_dir=tmp, progress=False)
            apo = APO(cfg)
            async with apo.services(sleeping_agent) as svc:
                cands = [await apo.add_candidate(svc, f"candidate prompt {k}") for k in range(args.candidates)]
                await apo.evaluate(svc, cands, tasks, round_=0)  # warm-up
                one: list[float] = []
                many: list[float] = []
                overlap: list[float] = []
                for rep in range(args.repeats):
                    t0 = time.perf_counter()
                    await apo.evaluate(svc, cands[:1], tasks, round_=2 * rep + 1)
                    one.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    evals = await apo.evaluate(svc, cands, tasks, round_=2 * rep + 2)
                    many.append(time.perf_counter() - t0)
                    windows: list[tuple[float, float]] = []
                    for ev in evals.values():
                        attempts = [a for rid in ev.rollout_ids for a in await svc.store.query_attempts(rid)]
                        windows.append((min(a.started_at for a in attempts), max(a.ended_at or 0 for a in attempts)))
                    # the time every candidate had rollouts running at once, over the whole evaluation
                    common = min(e for _, e in windows) - max(s for s, _ in windows)
                    overlap.append(max(0.0, common) / many[-1])
    t_one, t_many = statistics.median(one), statistics.median(many)
    ratio = t_many / t_one
    print(
        f"apo_parallel: {args.candidates} candidates x {args.tasks} tasks, concurrency {args.concurrency}, "
        f"agent sleeps {sleep_s} s, {args.repeats} repeats"
    )
    print(f"  one candidate:   median {t_one:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in one)})")
    print(f"  {args.candidates} candidates:    median {t_many:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in many)})")
    print(f"  ratio {ratio:.2f}x (1.0 = fully parallel, {args.candidates}.0 = one after another)")
    print(f"  all candidates running at once: median {statistics.median(overlap):.0%} of the evaluation's wall time")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {git_commit()}, {platform.machine()} "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load {load:.1f}"
    )
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each rollout sleeps")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
