"""``kill -9`` of the store server mid-stream loses no acknowledged span.

A real ``lightning-rl store serve --backend sqlite`` process is killed with SIGKILL while eight
clients write span batches into it; restarted on the same file, it must hold every span whose write
was answered with 200. (Unanswered writes may or may not be there: their client saw an error and
would retry, which is idempotent.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from lightning_rl.errors import StoreUnavailableError
from lightning_rl.store.client import StoreClient
from lightning_rl.types import AttemptStatus, Claim, RolloutRequest, Span, Task

pytestmark = pytest.mark.slow

WRITERS = 8
BATCH = 20
KILL_AFTER_BATCHES = 120


@asynccontextmanager
async def store_server(db: Path) -> AsyncGenerator[tuple[asyncio.subprocess.Process, str]]:
    """``lightning-rl store serve`` as a subprocess on a free port; yields the process and its URL."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lightning_rl.cli",
        "store",
        "serve",
        "--backend",
        "sqlite",
        "--path",
        str(db),
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        assert " at http://" in line, f"server did not start: {line!r}"
        yield proc, line.rsplit(" at ", 1)[1].strip()
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def write_until_failure(client: StoreClient, claim: Claim, acked: list[Span], progress: asyncio.Event) -> None:
    n = 0
    while True:
        batch = [
            Span(name=f"s{n + i}", rollout_id=claim.rollout.id, attempt_id=claim.attempt.id, attributes={"i": n + i})
            for i in range(BATCH)
        ]
        try:
            await client.add_spans(batch)
        except StoreUnavailableError:
            return  # the server is gone; this batch was never acknowledged
        acked.extend(batch)  # only now: the server answered 200
        n += BATCH
        progress.set()


async def test_acknowledged_spans_survive_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    acked: list[Span] = []
    async with store_server(db) as (proc, url):
        client = StoreClient(url, retries=0)
        await client.enqueue([RolloutRequest(id=f"ro-{i}", task=Task(input=i)) for i in range(WRITERS)])
        claims = await client.claim("crash-test", WRITERS)
        assert len(claims) == WRITERS
        progress = asyncio.Event()
        writers = [asyncio.create_task(write_until_failure(client, c, acked, progress)) for c in claims]
        while len(acked) < KILL_AFTER_BATCHES * BATCH:
            progress.clear()
            await asyncio.wait_for(progress.wait(), timeout=60)
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: every writer has a batch in flight or about to
        await proc.wait()
        await asyncio.wait_for(asyncio.gather(*writers), timeout=60)
        await client.close()
    assert len(acked) >= KILL_AFTER_BATCHES * BATCH

    async with store_server(db) as (_, url):
        client = StoreClient(url)
        try:
            for claim in claims:
                stored = await client.query_spans(attempt_id=claim.attempt.id, limit=10_000)
                stored_ids = [(s.trace_id, s.span_id) for s in stored]
                assert len(stored_ids) == len(set(stored_ids)), "a span was stored twice"
                want = {(s.trace_id, s.span_id) for s in acked if s.attempt_id == claim.attempt.id}
                missing = want - set(stored_ids)
                assert not missing, f"{len(missing)} acknowledged spans of {claim.attempt.id} were lost"
                assert [s.seq for s in stored] == list(range(1, len(stored) + 1))
            # The restarted store is fully usable: the attempts opened before the crash can finish.
            rollout = await client.finish_attempt(claims[0].attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
            assert rollout.status == "succeeded"
        finally:
            await client.close()


async def test_sigterm_stops_the_server_cleanly(tmp_path: Path) -> None:
    async with store_server(tmp_path / "term.db") as (proc, url):
        client = StoreClient(url)
        await client.enqueue([RolloutRequest(id="ro-keep", task=Task(input=1))])
        await client.close()
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), timeout=30) == 0
    async with store_server(tmp_path / "term.db") as (_, url):
        client = StoreClient(url)
        assert (await client.get_rollout("ro-keep")).status == "queued"
        await client.close()
