"""Store throughput: how many rollouts per second one store server completes.

Each of N simulated runners loops ``claim -> add 10 spans in one batch -> finish`` against a
``lightning-rl store serve`` process (a separate process, as in production) through ``StoreClient``
over HTTP. For each backend and N we report completed rollouts/s (median of ``--repeats`` runs),
and the CPU time the server and the client processes spent per rollout: on a shared machine the
wall-clock rate depends on what else runs, the CPU cost per rollout much less. Last, the same loop
runs in-process against ``SQLiteStore`` (no HTTP) to show the backend's own ceiling, and against
``RedisStore`` when a Redis backend is benchmarked.

Redis backends: ``redis`` is the server at ``--redis-url`` with whatever persistence it is configured
with (the shared test server keeps nothing on disk); ``redis-aof`` is a ``redis-server`` this script
starts in a temporary directory with ``appendonly yes`` and ``appendfsync always``: every acknowledged
write is fsynced, as with SQLite's ``synchronous=FULL``, so that row is the like-for-like comparison.

Run it when the machine is otherwise idle (it uses both cores: one for the server, one for the
clients)::

    uv run python benchmarks/store_throughput.py
    uv run python benchmarks/store_throughput.py --backends sqlite --runners 32 --duration 3
    uv run python benchmarks/store_throughput.py --backends redis,redis-aof --runners 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass

from lightning_rl.store.base import LightningStore
from lightning_rl.store.client import StoreClient
from lightning_rl.types import AttemptStatus, RolloutRequest, RolloutStatus, Span, Task

__all__ = ["main"]

BENCH_SCHEMA = "lightning_bench"
DEFAULT_DSN = os.environ.get("LIGHTNING_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
DEFAULT_REDIS_URL = os.environ.get("LIGHTNING_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
BENCH_PREFIX = "lightning_bench:"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--backends",
        default="sqlite,postgres,redis,redis-aof",
        help="Comma-separated: sqlite, postgres, redis, redis-aof, memory.",
    )
    p.add_argument("--runners", default="8,32,128", help="Comma-separated numbers of concurrent runners (N).")
    p.add_argument("--repeats", type=int, default=3, help="Runs per (backend, N); the median is reported.")
    p.add_argument("--duration", type=float, default=3.0, help="Seconds per run.")
    p.add_argument("--spans", type=int, default=10, help="Spans per rollout, sent in one batch.")
    p.add_argument("--backlog", type=int, default=0, help="Rollouts queued per run (0: 1500 x duration).")
    p.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL DSN (tables go to a scratch schema, dropped after).")
    p.add_argument(
        "--redis-url",
        default=DEFAULT_REDIS_URL,
        help="Redis server of the redis backend (keys under a scratch prefix).",
    )
    p.add_argument(
        "--in-process", type=float, default=3.0, help="Seconds per in-process SQLite (and Redis) run (0 skips)."
    )
    return p.parse_args(argv)


@dataclass
class Run:
    rate: float
    """Completed rollouts per second."""
    server_cpu_ms: float
    """Server process CPU per completed rollout (0 when in-process)."""
    client_cpu_ms: float
    """Client process CPU per completed rollout."""
    load: float
    """1-minute load average at the end of the run (2.0 = both cores busy)."""


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


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by ``pid`` (Linux /proc), or by this process."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_run(
    store: LightningStore, n: int, spans: int, duration: float, backlog: int, server_pid: int | None
) -> Run:
    """One timed run of ``n`` runners; cleans the store up afterwards."""
    requests = [RolloutRequest(task=Task(input={"q": i})) for i in range(backlog)]
    for start in range(0, backlog, 5000):
        await store.enqueue(requests[start : start + 5000])
    done = [0]
    server0, client0 = (process_cpu_s(server_pid) if server_pid else 0.0), process_cpu_s(None)
    t0 = time.perf_counter()
    await asyncio.gather(*(runner(store, f"w{i}", spans, t0 + duration, done) for i in range(n)))
    elapsed = time.perf_counter() - t0
    server_cpu = (process_cpu_s(server_pid) - server0) if server_pid else 0.0
    client_cpu = process_cpu_s(None) - client0
    completed = max(done[0], 1)
    if done[0] == backlog:
        print(f"  warning: the backlog of {backlog} ran out; raise --backlog", file=sys.stderr)
    run = Run(done[0] / elapsed, 1e3 * server_cpu / completed, 1e3 * client_cpu / completed, os.getloadavg()[0])
    # Leave nothing behind for the next run: cancel what was not claimed, then prune it all.
    left = await store.query_rollouts(status=[RolloutStatus.QUEUED], limit=10_000)
    while left:
        await store.cancel([r.id for r in left])
        left = await store.query_rollouts(status=[RolloutStatus.QUEUED], limit=10_000)
    await store.prune(time.time() + 1)
    return run


# --------------------------------------------------------------------------------------------
# HTTP runs against a server subprocess
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def aof_redis_server(workdir: str) -> Iterator[str]:
    """A ``redis-server`` in ``workdir`` with every write fsynced to its append-only file; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", workdir, "--save", ""]
    args += ["--appendonly", "yes", "--appendfsync", "always"]
    proc = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def drop_redis_keys(url: str) -> None:
    import redis

    with redis.Redis.from_url(url) as client:
        keys = list(client.scan_iter(match=BENCH_PREFIX + "*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])


@contextlib.asynccontextmanager
async def server_process(backend: str, workdir: str, where: str) -> AsyncGenerator[tuple[str, int]]:
    """``lightning-rl store serve`` for ``backend``; ``where`` is the PostgreSQL DSN or the Redis URL."""
    kind = "redis" if backend.startswith("redis") else backend
    cmd = [sys.executable, "-m", "lightning_rl.cli", "store", "serve", "--backend", kind, "--port", "0"]
    cmd += ["--path", os.path.join(workdir, "bench.db")] if backend == "sqlite" else []
    cmd += ["--dsn", where, "--schema", BENCH_SCHEMA] if backend == "postgres" else []
    cmd += ["--redis-url", where, "--prefix", BENCH_PREFIX] if kind == "redis" else []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if " at http" not in line:
            raise RuntimeError(f"store server did not start (exit code {proc.poll()}); output: {line!r}")
        yield line.rsplit(" at ", 1)[1].strip(), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if backend == "postgres":
            drop_schema(where)
        if kind == "redis":
            drop_redis_keys(where)


def drop_schema(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {BENCH_SCHEMA} CASCADE")


async def bench_http(args: argparse.Namespace, backend: str, ns: list[int]) -> dict[int, list[Run]]:
    results: dict[int, list[Run]] = {}
    backlog = args.backlog or max(2000, int(1500 * args.duration))
    with tempfile.TemporaryDirectory() as workdir, contextlib.ExitStack() as stack:
        where = args.dsn
        if backend == "redis":
            where = args.redis_url
        elif backend == "redis-aof":
            where = stack.enter_context(aof_redis_server(workdir))
        async with server_process(backend, workdir, where) as (url, pid):
            client = StoreClient(url)
            try:
                await one_run(client, 4, args.spans, 0.5, 200, None)  # warm up connections and caches
                for n in ns:
                    results[n] = []
                    for _ in range(args.repeats):
                        results[n].append(await one_run(client, n, args.spans, args.duration, backlog, pid))
                        print(f"{backend:8s} N={n:<4d} {results[n][-1]}", flush=True)
            finally:
                await client.close()
    return results


async def bench_in_process(args: argparse.Namespace, backend: str = "sqlite") -> list[Run]:
    from lightning_rl.store.redis import RedisStore
    from lightning_rl.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory() as workdir, contextlib.ExitStack() as stack:
        store: LightningStore
        if backend == "sqlite":
            store = SQLiteStore(os.path.join(workdir, "inproc.db"))
        else:
            url = args.redis_url if backend == "redis" else stack.enter_context(aof_redis_server(workdir))
            store = await RedisStore.open(url, prefix=BENCH_PREFIX)
        try:
            backlog = args.backlog or max(2000, int(1500 * args.in_process))
            return [await one_run(store, 32, args.spans, args.in_process, backlog, None) for _ in range(args.repeats)]
        finally:
            await store.close()
            if backend == "redis":
                drop_redis_keys(url)


def row(label: str, n: int, runs: list[Run]) -> str:
    med = statistics.median
    rates = ", ".join(f"{r.rate:.0f}" for r in runs)
    return (
        f"| {label} | {n} | **{med(r.rate for r in runs):.0f}** | {rates} | {med(r.server_cpu_ms for r in runs):.2f} "
        f"| {med(r.client_cpu_ms for r in runs):.2f} | {max(r.load for r in runs):.1f} |"
    )


async def amain(args: argparse.Namespace) -> None:
    ns = [int(x) for x in args.runners.split(",") if x]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    rows: list[str] = []
    backends = [b for b in args.backends.split(",") if b]
    for backend in backends:
        for n, runs in (await bench_http(args, backend, ns)).items():
            rows.append(row(f"{backend} over HTTP", n, runs))
    if args.in_process > 0:
        runs = await bench_in_process(args)
        rows.append(row("sqlite in-process", 32, runs))
        ops = statistics.median(r.rate for r in runs) * 3  # claim + add_spans + finish per rollout
        print(f"in-process SQLite: {ops:.0f} store ops/s (claim, add_spans x10, finish)")
        for backend in [b for b in backends if b.startswith("redis")]:
            runs = await bench_in_process(args, backend)
            rows.append(row(f"{backend} in-process", 32, runs))
    print("\n| store | N runners | rollouts/s (median) | runs | server CPU ms/rollout | client CPU ms/rollout | load |")
    print("|---|---:|---:|---|---:|---:|---:|")
    print("\n".join(rows))


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    main()
