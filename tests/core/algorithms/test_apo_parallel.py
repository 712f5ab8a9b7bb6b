"""The candidates of an APO round are evaluated in parallel, not one after another.

An agent that sleeps 0.2 s: one candidate on 8 tasks takes about one sleep; 4 candidates on the
same 8 tasks with concurrency 32 must take at most 1.5x that (one after another would be 4x), and
the rollouts of the 4 candidates must overlap in time in the store's own attempt records.
benchmarks/apo_parallel.py measures the same thing over more repeats.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lightning_rl.agent import LLM
from lightning_rl.algorithms.apo import APO, APOConfig, prompt_template
from lightning_rl.gateway import running_gateway
from lightning_rl.testing import FakeUpstream
from lightning_rl.types import Task

SLEEP_S = 0.2


async def sleeping_agent(task: dict[str, int], llm: LLM) -> float:
    await asyncio.sleep(SLEEP_S)
    return len(prompt_template("system")) / 100.0


@pytest.fixture
async def upstream_url() -> AsyncIterator[str]:
    # the agent's model endpoint the resources name; this agent never calls it
    async with running_gateway(FakeUpstream(model="fake-model").app) as url:
        yield url


async def test_four_candidates_take_about_as_long_as_one(tmp_path: Path, upstream_url: str) -> None:
    cfg = APOConfig(concurrency=32, llm_base_url=f"{upstream_url}/v1", run_dir=str(tmp_path), progress=False)
    apo = APO(cfg)
    tasks = [Task(input={"i": i}, id=f"t{i}") for i in range(8)]
    async with apo.services(sleeping_agent) as svc:
        cands = [await apo.add_candidate(svc, f"prompt number {k}") for k in range(4)]
        await apo.evaluate(svc, cands, tasks, round_=0)  # warm-up: first claims, first SQLite pages
        one: list[float] = []
        four: list[float] = []
        evals = {}
        for rep in range(5):  # alternated, medians: a busy machine slows some runs
            t0 = time.perf_counter()
            await apo.evaluate(svc, cands[:1], tasks, round_=2 * rep + 1)
            one.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            evals = await apo.evaluate(svc, cands, tasks, round_=2 * rep + 2)
            four.append(time.perf_counter() - t0)
        # the rollouts of the last round, per candidate: [start, end] of their attempts
        spans: dict[str, tuple[float, float]] = {}
        for cid, ev in evals.items():
            attempts = [a for rid in ev.rollout_ids for a in await svc.store.query_attempts(rid)]
            assert len(attempts) == 8 and all(a.ended_at is not None for a in attempts)
            spans[cid] = (min(a.started_at for a in attempts), max(a.ended_at or 0.0 for a in attempts))
            assert ev.score == pytest.approx(len(f"prompt number {cid[1:]}") / 100.0) and ev.failed == 0

    assert max(s for s, _ in spans.values()) < min(e for _, e in spans.values()), f"no overlap: {spans}"
    t_one, t_four = statistics.median(one), statistics.median(four)
    assert t_one >= SLEEP_S
    assert t_four <= 1.5 * t_one, f"4 candidates took {t_four:.3f} s, one {t_one:.3f} s (runs: {four} vs {one})"
