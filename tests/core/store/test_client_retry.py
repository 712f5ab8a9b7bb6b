"""A store client that outlasts a restart of the store server (issue 45).

benchmarks/chaos.py kills ``store serve`` under a training run; the trainer's client used to give up
after its 5 quick retries (about 1.5 s), so a store server restart of a few seconds ended a run of
hours with ``StoreUnavailableError``. ``retry_for_s`` keeps retrying for a time budget instead; the
trainer opens its store server with ``TrainerConfig.store_retry_s``. Real server, real port.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from lightning_rl.errors import InvalidRequestError, StoreUnavailableError
from lightning_rl.store.client import StoreClient
from lightning_rl.store.server import running_store_server
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.trainer import TrainerConfig
from lightning_rl.types import RolloutRequest, Task


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve_later(db: Path, port: int, after_s: float, stop: asyncio.Event) -> None:
    await asyncio.sleep(after_s)
    store = SQLiteStore(db)
    try:
        async with running_store_server(store, port=port):
            await stop.wait()
    finally:
        await store.close()


async def test_a_call_waits_out_a_store_server_restart(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    server = asyncio.create_task(_serve_later(tmp_path / "s.db", port, 3.0, stop))
    try:
        async with StoreClient(url) as quick:  # the old behaviour: gone after ~1.5 s of retries
            with pytest.raises(StoreUnavailableError, match="unreachable"):
                await quick.enqueue([RolloutRequest(id="r0", task=Task(input=0))])
        t0 = time.monotonic()
        async with StoreClient(url, retry_for_s=30.0) as patient:
            [rollout] = await patient.enqueue([RolloutRequest(id="r1", task=Task(input=1))])
        assert rollout.id == "r1" and time.monotonic() - t0 < 30
    finally:
        stop.set()
        await server


async def test_the_budget_ends_and_bad_values_are_refused() -> None:
    port = _free_port()  # nothing listens here
    t0 = time.monotonic()
    async with StoreClient(f"http://127.0.0.1:{port}", retry_for_s=5.0) as client:
        with pytest.raises(StoreUnavailableError):
            await client.stats()
    assert 3.0 <= time.monotonic() - t0 < 15  # past the ~1.5 s the 5 retries alone take
    with pytest.raises(InvalidRequestError, match="retry_for_s"):
        StoreClient("http://127.0.0.1:1", retry_for_s=-1)
    assert TrainerConfig().store_retry_s >= 60  # long enough for a restart of the server or its database
