"""Store throughput: how many rollouts per second one store server completes.

Each of N simulated runners loops ``claim -> add 10 spans in one batch -> finish`` against a
``lightning-rl store serve`` process (a separate process, as in production), through ``StoreClient``
over HTTP. We report completed rollouts/s (median of ``--repeats`` runs) for each backend and N, and
the same loop run in-process against ``SQLiteStore`` (store operations/s, no HTTP).

Run it when the machine is otherwise idle (it uses both the server's and the clients' CPU)::

    uv run python benchmarks/store_throughput.py
    uv run python benchmarks/store_throughput.py --backends sqlite --runners 32 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence

from lightning_rl.store.base import LightningStore
from lightning_rl.store.client import StoreClient
from lightning_rl.types import AttemptStatus, RolloutRequest, RolloutStatus, Span, Task

__all__ = ["main"]

CLI = os.environ.get("LIGHTNING_CLI", "-m lightning_rl.cli").split()
DEFAULT_DSN = os.environ.get("LIGHTNING_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backends", default="sqlite,postgres", help="Comma-separated: sqlite, postgres, memory.")
    p.add_argument("--runners", default="8,32,128", help="Comma-separated numbers of concurrent runners (N).")
    p.add_argument("--repeats", type=int, default=3, help="Runs per (backend, N); the median is reported.")
    p.add_argument("--duration", type=float, default=3.0, help="Seconds per run.")
    p.add_argument("--spans", type=int, default=10, help="Spans per rollout, sent in one batch.")
    p.add_argument("--backlog", type=int, default=0, help="Rollouts queued per run (0: 3000 x duration).")
    p.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL DSN for the postgres backend.")
    p.add_argument("--in-process", type=float, default=3.0, help="Seconds for the in-process SQLite run (0 skips).")
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------
# The simulated runner loop (shared by the HTTP and the in-process runs)
# --------------------------------------------------------------------------------------------


def make_spans(rollout_id: str, attempt_id: str, n: int) -> list[Span]:
    return [
        Span(
            name="llm.call" if i % 2 == 0 else "tool",
            rollout_id=rollout_id,
            attempt_id=attempt_id,
            attributes={"gen_ai.request.model": "bench", "lightning.prompt_token_ids": list(range(32)), "i": i},
        )
        for i in range(n)
    ]


async def runner(store: LightningStore, worker_id: str, spans: int, deadline: float, done: list[int]) -> None:
    while time.perf_counter() < deadline:
        claims = await store.claim(worker_id, 1)
        if not claims:
            return
        attempt = claims[0].attempt
        await store.add_spans(make_spans(attempt.rollout_id, attempt.id, spans))
        await store.finish_attempt(attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
        done[0] += 1


async def one_run(store: LightningStore, n: int, spans: int, duration: float, backlog: int) -> float:
    """Completed rollouts/s for one run of ``n`` runners; cleans the store up afterwards."""
    requests = [RolloutRequest(task=Task(input={"q": i})) for i in range(backlog)]
    for start in range(0, backlog, 5000):
        await store.enqueue(requests[start : start + 5000])
    done = [0]
    t0 = time.perf_counter()
    await asyncio.gather(*(runner(store, f"w{i}", spans, t0 + duration, done) for i in range(n)))
    rate = done[0] / (time.perf_counter() - t0)
    # Leave nothing behind for the next run: cancel what was not claimed, then prune it all.
    left = await store.query_rollouts(status=[RolloutStatus.QUEUED], limit=10_000)
    while left:
        await store.cancel([r.id for r in left])
        left = await store.query_rollouts(status=[RolloutStatus.QUEUED], limit=10_000)
    await store.prune(time.time() + 1)
    return rate


# --------------------------------------------------------------------------------------------
# HTTP runs against a server subprocess
# --------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def server_process(backend: str, workdir: str, dsn: str) -> AsyncIterator[str]:
    cmd = [sys.executable, *CLI, "store", "serve", "--backend", backend, "--port", "0"]
    cmd += ["--path", os.path.join(workdir, "bench.db")] if backend == "sqlite" else []
    cmd += ["--dsn", dsn] if backend == "postgres" else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if " at http" not in line:
            raise RuntimeError(f"store server did not start (exit code {proc.poll()}); output: {line!r}")
        yield line.rsplit(" at ", 1)[1].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def bench_http(args: argparse.Namespace, backend: str, ns: list[int]) -> dict[int, list[float]]:
    results: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        async with server_process(backend, workdir, args.dsn) as url:
            client = StoreClient(url)
            try:
                await one_run(client, 4, args.spans, 0.5, 200)  # warm up connections and caches
                for n in ns:
                    backlog = args.backlog or max(2000, int(3000 * args.duration))
                    results[n] = [await one_run(client, n, args.spans, args.duration, backlog) for _ in range(args.repeats)]
                    print(f"{backend:8s} N={n:<4d} rollouts/s: " + ", ".join(f"{r:.0f}" for r in results[n]), flush=True)
            finally:
                await client.close()
    return results


# --------------------------------------------------------------------------------------------
# In-process SQLite
# --------------------------------------------------------------------------------------------


async def bench_in_process(args: argparse.Namespace) -> tuple[float, float]:
    from lightning_rl.store import open_store

    with tempfile.TemporaryDirectory() as workdir:
        store = await open_store(f"sqlite:///{os.path.join(workdir, 'inproc.db')}")
        try:
            rates = [await one_run(store, 32, args.spans, args.in_process, 10_000) for _ in range(args.repeats)]
        finally:
            await store.close()
    rate = statistics.median(rates)
    return rate, rate * 3  # claim + add_spans + finish per rollout


async def amain(args: argparse.Namespace) -> None:
    ns = [int(x) for x in args.runners.split(",") if x]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    table: list[tuple[str, int, float, list[float]]] = []
    for backend in [b for b in args.backends.split(",") if b]:
        for n, runs in (await bench_http(args, backend, ns)).items():
            table.append((backend, n, statistics.median(runs), runs))
    print("\n| backend | N runners | rollouts/s (median) | runs |")
    print("|---|---:|---:|---|")
    for backend, n, median, runs in table:
        print(f"| {backend} | {n} | {median:.0f} | {', '.join(f'{r:.0f}' for r in runs)} |")
    if args.in_process > 0:
        rate, ops = await bench_in_process(args)
        print(f"\nin-process SQLite, 32 concurrent loops: {rate:.0f} rollouts/s = {ops:.0f} store ops/s")


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    main()
