"""SpanWriter: off the request path, retried until acknowledged, bounded, rejects isolated."""

from __future__ import annotations

import asyncio
import socket
import threading

from lightning_rl.spans import SpanWriter
from lightning_rl.store import MemoryStore
from lightning_rl.store.client import StoreClient
from lightning_rl.store.server import running_store_server
from lightning_rl.types import Span

from .conftest import claim_attempts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spans_for(rollout_id: str, attempt_id: str, k: int, prefix: str = "s") -> list[Span]:
    return [Span(name=f"{prefix}{i}", rollout_id=rollout_id, attempt_id=attempt_id) for i in range(k)]


async def test_store_down_then_up_loses_nothing() -> None:
    backing = MemoryStore()
    [claim] = await claim_attempts(backing, 1)
    port = free_port()
    client = StoreClient(f"http://127.0.0.1:{port}", retries=0, timeout_s=2.0)
    writer = SpanWriter(client, max_batch=16, flush_interval_s=0.01, initial_backoff_s=0.02, max_backoff_s=0.1)
    spans = spans_for(claim.rollout.id, claim.attempt.id, 50)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for span in spans:
        writer.submit(span)  # never blocks, although nothing listens on the port
    assert loop.time() - started < 0.05
    assert not await writer.flush(timeout=0.3)  # the store is down: not acknowledged yet
    assert writer.retries > 0 and writer.written == 0 and writer.pending == 50
    async with running_store_server(backing, port=port):
        assert await writer.flush(timeout=10.0)
        await writer.close()
    await client.close()
    stored = await backing.query_spans(rollout_id=claim.rollout.id)
    assert sorted(s.span_id for s in stored) == sorted(s.span_id for s in spans)
    assert writer.stats().written == 50 and writer.dropped == 0 and writer.rejected == 0


async def test_queue_overflow_drops_the_oldest_and_counts_them() -> None:
    store = MemoryStore()
    [claim] = await claim_attempts(store, 1)
    writer = SpanWriter(store, max_queue=10, flush_interval_s=0.01)
    spans = spans_for(claim.rollout.id, claim.attempt.id, 25)
    writer.submit_many(spans)  # all at once: the writer task has had no chance to drain
    assert writer.dropped == 15 and writer.pending == 10
    assert await writer.flush(5.0)
    await writer.close()
    stored = {s.name for s in await store.query_spans(rollout_id=claim.rollout.id)}
    assert stored == {s.name for s in spans[15:]}  # the newest ten survived


async def test_spans_of_unknown_attempts_are_rejected_not_retried_forever() -> None:
    store = MemoryStore()
    [claim] = await claim_attempts(store, 1)
    writer = SpanWriter(store, flush_interval_s=0.01)
    good = spans_for(claim.rollout.id, claim.attempt.id, 3, "good")
    bad = spans_for(claim.rollout.id, "at-unknown", 2, "bad")
    writer.submit_many([good[0], bad[0], good[1], bad[1], good[2]])  # one batch mixing both
    assert await writer.flush(5.0)
    assert writer.rejected == 2 and writer.written == 3 and writer.retries == 0
    assert [s.name for s in await store.query_spans(rollout_id=claim.rollout.id)] == ["good0", "good1", "good2"]
    await writer.close()


async def test_submit_from_another_thread_and_close_flushes() -> None:
    store = MemoryStore()
    [claim] = await claim_attempts(store, 1)
    writer = SpanWriter(store, flush_interval_s=0.5)
    writer.start()
    spans = spans_for(claim.rollout.id, claim.attempt.id, 20)
    thread = threading.Thread(target=writer.submit_many, args=(spans,))
    thread.start()
    thread.join()
    assert await writer.close(timeout=5.0)
    assert len(await store.query_spans(rollout_id=claim.rollout.id)) == 20
    writer.submit(spans[0])  # after close: dropped and counted, never raises
    assert writer.dropped == 1
