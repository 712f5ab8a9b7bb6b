"""Rollout throughput of the demo's RL phase versus the embedded engine's own batched decode speed.

``lightning-rl demo`` trains the calculator agent (plain ``openai`` client, two turns with a tool
call) with 16 tasks x 8 rollouts per step, all 128 running at once, through the whole stack: SQLite
store -> in-process runner -> gateway -> embedded engine. This runs a few of those RL steps with the
demo's trainer settings (``Trainer._train_step``, update and weight publication included) on a
warm-started demo model and reports ``train/rollout_tokens_per_s`` as the trainer logs it (response
tokens of the step's transitions / seconds from enqueue to the last span flushed), next to
``benchmarks/engine_batching.py``'s batched figure (16 requests x 64 tokens on the tiny model; its
one-at-a-time half is skipped) measured first in the same process, and their ratio: how much of the
engine's speed the stack around it keeps.

    uv run python benchmarks/rollout_throughput.py --model runs/demo/warm_start [--steps 5] [--threads 1]
    uv run python benchmarks/rollout_throughput.py --model M --steps 3 --skip-engine --profile runs/rollout.prof

Without ``--model`` the tiny model is warm-started briefly first (response lengths, not quality,
matter here). The first step is a warm-up and is not counted. Per step it also prints (stderr) the
engine's scheduler counters, when the agents started and returned, and garbage-collection time;
the table adds the engine thread's busy time (wall, and its own CPU) and the process's CPU seconds
from the step's start to its update, the figure least disturbed by other jobs on a shared host.
``--profile`` writes cProfiles (CPU time) of the last step's event-loop thread and engine thread.
On a busy host use ``--threads 1``: torch's two-thread pool collapses when cores are oversubscribed,
and the engine figure with it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib.util
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from lightning_rl.demo.calculator import calculator_agent, make_tasks
from lightning_rl.demo.run import DemoConfig, warm_start
from lightning_rl.demo.run import demo_trainer_config as _demo_trainer_config
from lightning_rl.trainer import Trainer, TrainerConfig
from lightning_rl.trainer.services import Services, resolve_model
from lightning_rl.types import Task

__all__ = ["main", "demo_trainer_config"]

_HERE = Path(__file__).resolve().parent


def demo_trainer_config(model: str, run_dir: str, cfg: DemoConfig) -> TrainerConfig:
    """The demo's ``TrainerConfig`` (one definition, in ``lightning_rl.demo.run``), quiet."""
    return _demo_trainer_config(model, run_dir, cfg, progress=False, tensorboard=False)


def engine_batched_tokens_per_s(model: str | None, runs: int) -> float:
    """``engine_batching.py``'s batched tokens/s with its defaults (16 concurrent requests x 64 tokens,
    temperature 1, tiny model), median of ``runs`` after its warm-up; its one-at-a-time half is skipped."""
    spec = importlib.util.spec_from_file_location("_engine_batching", _HERE / "engine_batching.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from lightning_rl.engine import SamplingParams
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.engine.tiny import default_tiny_model

    path = model or str(default_tiny_model(tempfile.gettempdir() + "/lightning-bench-cache"))
    requests, max_tokens = 16, 64

    async def measure(engine: TransformersEngine) -> float:
        prompts: list[list[int]] = module._prompts(engine, requests)

        async def batched() -> int:
            outs = await asyncio.gather(
                *(
                    engine.generate(p, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i))
                    for i, p in enumerate(prompts)
                )
            )
            return sum(len(o.token_ids) for o in outs)

        await batched()  # warm-up, as engine_batching.py does
        rates: list[float] = [await module._timed(batched) for _ in range(runs)]
        return statistics.median(rates)

    with TransformersEngine.from_pretrained(path, max_batch_size=requests) as engine:
        return asyncio.run(measure(engine))


@contextmanager
def _maybe_profile(path: str | None) -> Generator[None]:
    if path is None:
        yield
        return
    profiler = cProfile.Profile(time.thread_time)  # CPU time: GIL waits and idle polls do not count
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        profiler.dump_stats(path)
        print(f"profile written to {path} (CPU time of the event loop's thread; the engine's in {path}.engine)")


class _EngineClock:
    """Time the engine thread spends in scheduler iterations (prefill, decode, sampling, swaps).

    Wraps the engine's ``_iteration`` on the instance (the worker looks it up on every turn), so the
    benchmark sees how busy the engine was during the rollouts: busy / rollout seconds near 1 means
    the engine is the bottleneck, well below 1 means the stack around it is.
    """

    def __init__(self, engine: Any) -> None:
        self.busy_s = 0.0
        self.cpu_s = 0.0
        self.profiler: cProfile.Profile | None = None
        inner = engine._iteration

        def timed() -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            profiler = self.profiler
            if profiler is not None:
                profiler.enable()
            try:
                inner()
            finally:
                if profiler is not None:
                    profiler.disable()
                self.busy_s += time.perf_counter() - t0
                self.cpu_s += time.thread_time() - c0

        engine._iteration = timed


class _GCClock:
    """Time spent in the garbage collector (all threads), per generation."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.counts = [0, 0, 0]
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            generation = info["generation"]
            self.seconds[generation] += time.perf_counter() - self._start
            self.counts[generation] += 1

    def snapshot(self) -> tuple[float, list[int]]:
        return sum(self.seconds), list(self.counts)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class _RolloutCPU:
    """Process CPU seconds from the start of a step to the start of its update (the rollout phase
    plus span collection): robust to other jobs on a shared machine, unlike wall time."""

    def __init__(self, svc: Services) -> None:
        self.rollout_s = 0.0
        self._t0 = 0.0
        inner = svc.backend.update

        def update(batch: Any) -> Any:
            self.rollout_s = _cpu_s() - self._t0
            return inner(batch)

        svc.backend.update = update  # type: ignore[method-assign]

    def start(self) -> None:
        self._t0 = _cpu_s()
        self.rollout_s = float("nan")

    def finish(self) -> None:
        """A step without an update (no transition had an advantage): its CPU up to now."""
        if self.rollout_s != self.rollout_s:
            self.rollout_s = _cpu_s() - self._t0


class _AgentTimes:
    """When the agents of a step start and return, relative to the step's start: the gap before the
    first start is enqueue + claim, the gap after the last return is reporting + span flushing."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def wrap(self, agent: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        async def timed(task: Any, llm: Any) -> Any:
            self.starts.append(time.perf_counter())
            try:
                return await agent(task, llm)
            finally:
                self.ends.append(time.perf_counter())

        return timed

    def summary(self, t0: float) -> str:
        if not self.starts or not self.ends:
            return "no agents ran"
        ends = sorted(e - t0 for e in self.ends)
        return (
            f"agents started {min(self.starts) - t0:.2f}-{max(self.starts) - t0:.2f} s, "
            f"returned {ends[0]:.2f}-{ends[-1]:.2f} s (median {ends[len(ends) // 2]:.2f})"
        )


async def _run_steps(
    trainer: Trainer, tasks: list[Task], steps: int, profile: str | None, on_step: Callable[[Services, int], None]
) -> list[dict[str, float]]:
    import random

    cfg = trainer.config
    rng = random.Random(cfg.seed)
    rows: list[dict[str, float]] = []
    times = _AgentTimes()
    async with trainer._services(times.wrap(calculator_agent)) as svc:  # pyright: ignore[reportPrivateUsage]
        clock = _EngineClock(svc.engine)
        gc_clock = _GCClock()
        rollout_cpu = _RolloutCPU(svc)
        for step in range(1, steps + 1):
            batch = rng.sample(tasks, cfg.batch_size)
            busy, cpu = clock.busy_s, clock.cpu_s
            gc_s, gc_counts = gc_clock.snapshot()
            times.starts.clear()
            times.ends.clear()
            t0 = time.perf_counter()
            rollout_cpu.start()
            last = profile is not None and step == steps
            clock.profiler = cProfile.Profile(time.thread_time) if last else None
            with _maybe_profile(profile if last else None):
                row = await trainer._train_step(svc, step, batch)  # pyright: ignore[reportPrivateUsage]
            if clock.profiler is not None and profile is not None:
                clock.profiler.dump_stats(profile + ".engine")
                clock.profiler = None
            row["bench/engine_busy_s"] = clock.busy_s - busy
            row["bench/engine_cpu_s"] = clock.cpu_s - cpu
            rollout_cpu.finish()
            row["bench/rollout_cpu_s"] = rollout_cpu.rollout_s
            rows.append(row)
            on_step(svc, step)
            gc_after, counts_after = gc_clock.snapshot()
            collections = [b - a for a, b in zip(gc_counts, counts_after, strict=True)]
            print(
                f"  step {step}: {times.summary(t0)}; rollout phase {row['train/rollout_s']:.2f} s; "
                f"gc {gc_after - gc_s:.3f} s in {collections} collections (whole step)",
                file=sys.stderr,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="a warm-started demo model (HF folder); default: warm-start the tiny model")
    parser.add_argument("--steps", type=int, default=4, help="RL steps; the first is a warm-up (default 4)")
    parser.add_argument("--engine-runs", type=int, default=3, help="runs of the engine measurement (median)")
    parser.add_argument("--skip-engine", action="store_true", help="skip the engine measurement (quick iterations)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", help="cProfile the last step's event-loop thread into this file")
    parser.add_argument("--threads", type=int, help="torch intra-op threads; default torch's")
    parser.add_argument("--switch-interval", type=float, help="sys.setswitchinterval (s); default Python's 0.005")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)

    demo = DemoConfig(seed=args.seed, progress=False)
    tasks = make_tasks(demo.n_train + demo.n_val, seed=demo.seed)[: demo.n_train]
    workdir = Path(tempfile.mkdtemp(prefix="lightning-rollout-bench-"))
    try:
        model = args.model
        if model is None:
            quick = DemoConfig(seed=args.seed, expert_steps=200, polish_steps=50, habit_steps=20, progress=False)
            model = str(warm_start(resolve_model("tiny"), workdir / "warm_start", quick, tasks))
        t0 = time.perf_counter()
        batched = float("nan") if args.skip_engine else engine_batched_tokens_per_s(None, args.engine_runs)
        print(f"  engine measurement: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        (workdir / "run").mkdir()
        trainer = Trainer(demo_trainer_config(model, str(workdir / "run"), demo))

        def on_step(svc: Services, step: int) -> None:
            stats = svc.engine.stats()
            sizes = stats.prefill_sizes
            print(
                f"  step {step}: engine prefills {stats.prefills}, decode steps {stats.decode_steps}, "
                f"tokens {stats.generated_tokens}, peak batch {stats.peak_batch}, "
                f"mean prefill rows (last 100) {statistics.fmean(sizes) if sizes else 0:.1f}, "
                f"prompt tokens computed {getattr(stats, 'prefill_tokens', 0)} "
                f"(saved {getattr(stats, 'prefill_tokens_saved', 0)})",
                file=sys.stderr,
            )

        started = time.perf_counter()
        rows = asyncio.run(_run_steps(trainer, tasks, args.steps, args.profile, on_step))
        wall = time.perf_counter() - started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        "| step | rollout s | response tokens | rollout tok/s | calls | reward "
        "| engine busy s (thread cpu s) | process cpu s until the update | step s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        tokens = row["train/rollout_tokens_per_s"] * row["train/rollout_s"]
        print(
            f"| {int(row['step'])} | {row['train/rollout_s']:.2f} | {tokens:.0f} | "
            f"{row['train/rollout_tokens_per_s']:.0f} | {int(row['train/n_transitions'])} | "
            f"{row['train/reward_mean']:.2f} | {row['bench/engine_busy_s']:.2f} ({row['bench/engine_cpu_s']:.2f}) | "
            f"{row['bench/rollout_cpu_s']:.2f} | {row['train/step_s']:.2f} |"
        )
    counted = rows[1:] or rows
    rollout = statistics.median(r["train/rollout_tokens_per_s"] for r in counted)
    print()
    print(
        f"model: {model}; {len(rows)} steps in {wall:.1f} s (the first not counted); "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"engine_batching.py batched (16 requests x 64 tokens, tiny model): {batched:.0f} tok/s")
    print(f"rollout tokens/s (median of steps 2..{len(rows)}): {rollout:.0f}")
    print(f"ratio rollout / engine batched: {rollout / batched:.2f}")


if __name__ == "__main__":
    main()
