"""What only the Redis store has to prove: durability on a server it does not control, key isolation,
and atomicity of its two Lua paths under many concurrent clients.

The contract suite (``test_contract.py``) and the fault tests (``test_concurrency.py``) already run
against ``RedisStore`` on the shared server (``LIGHTNING_TEST_REDIS_URL``). The durability test here
starts its **own** ``redis-server`` with the append-only file on (``appendfsync always``, and again
with ``everysec``), writes through the store while a ``kill -9`` hits the server, restarts it on the
same directory, and checks that every write the store acknowledged is there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lightning_rl.errors import NotFoundError, StoreUnavailableError
from lightning_rl.store import open_store
from lightning_rl.types import (
    AttemptStatus,
    Resources,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    Task,
)

pytestmark = pytest.mark.redis

redis_mod = pytest.importorskip("redis")


# --------------------------------------------------------------------------------------------
# A redis-server of our own (AOF on), killed with SIGKILL and restarted on the same directory
# --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A ``redis-server`` subprocess on loopback, with the append-only file fsynced on every write."""

    directory: Path
    appendfsync: str = "always"
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
            + ["--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "", "--daemonize", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with redis_mod.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1) as client:
                    if client.ping():
                        return
            except redis_mod.RedisError:
                pass
            assert self.proc.poll() is None, f"redis-server exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "redis-server did not answer PING within 30 s"
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL: no shutdown, no final save
            self.proc.wait(timeout=30)


@pytest.fixture
def own_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RedisServer]:
    """Our own redis-server; ``appendfsync always`` unless the test is parametrised indirectly."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server package)")
    server = RedisServer(tmp_path / "redis-data", appendfsync=getattr(request, "param", "always"))
    server.directory.mkdir()
    server.start()
    try:
        yield server
    finally:
        server.kill()


@dataclass
class Acked:
    """Everything the store answered for (so it must survive the crash)."""

    finished: dict[str, Rollout] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)
    resources: list[Resources] = field(default_factory=list)
    enqueued: list[str] = field(default_factory=list)


async def _write_until_failure(url: str, tag: str, acked: Acked, progress: asyncio.Event) -> None:
    """Loop enqueue -> claim -> add spans -> heartbeat -> finish (and publish resources now and then)
    until the server is gone; record each write only once the store returned."""
    store = await open_store(url)
    try:
        i = 0
        while True:
            config = RolloutConfig(max_attempts=2, retry_on=["failed"])
            (rollout,) = await store.enqueue([RolloutRequest(id=f"{tag}{i}", task=Task(input=i), config=config)])
            acked.enqueued.append(rollout.id)
            (claim,) = await store.claim("durable-worker")
            batch = [
                Span(name=f"s{j}", rollout_id=claim.rollout.id, attempt_id=claim.attempt.id, attributes={"j": j})
                for j in range(5)
            ]
            await store.add_spans(batch)
            acked.spans += batch
            await store.heartbeat(claim.attempt.id)
            done = await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=i / 10)
            acked.finished[done.id] = done
            if i % 10 == 0:
                acked.resources.append(await store.add_resources(prompts={"v": str(i)}))
            i += 1
            progress.set()
    except StoreUnavailableError:
        return  # the server died; the write in flight was not acknowledged
    finally:
        await store.close()


@pytest.mark.parametrize("own_redis", ["always", "everysec"], indirect=True)
async def test_acknowledged_writes_survive_kill_9_of_the_server(own_redis: RedisServer) -> None:
    """With ``everysec`` too: a killed server process loses nothing its clients saw acknowledged (the
    file was written before the reply; only the fsync waits), what ``everysec`` risks is a lost machine."""
    urls = [own_redis.url + f"?prefix=w{k}:" for k in range(2)]  # two writers, two stores in one database
    acked = [Acked() for _ in urls]
    progress = asyncio.Event()
    writers = [
        asyncio.create_task(_write_until_failure(url, f"w{k}-", acked[k], progress)) for k, url in enumerate(urls)
    ]
    await asyncio.wait_for(progress.wait(), timeout=30)
    while sum(len(a.finished) for a in acked) < 40:  # enough traffic that the kill lands mid-stream
        await asyncio.sleep(0.02)
    own_redis.kill()
    await asyncio.wait_for(asyncio.gather(*writers), timeout=30)

    own_redis.start()  # same --dir: the server replays its append-only file
    for url, mine in zip(urls, acked, strict=True):
        assert mine.finished and mine.resources
        store = await open_store(url)
        try:
            found = {r.id: r for r in await store.query_rollouts(limit=10_000)}
            assert set(mine.enqueued) <= set(found), "an acknowledged enqueue was lost"
            for rid, rollout in mine.finished.items():
                assert found[rid] == rollout, f"the acknowledged finish of {rid} was lost"
                (attempt,) = await store.query_attempts(rid)
                assert attempt.status is AttemptStatus.SUCCEEDED and attempt.reward == rollout.final_reward
                assert attempt.heartbeat_at > attempt.started_at  # the acknowledged heartbeat too
            stored = {(s.attempt_id, s.span_id): s for s in await store.query_spans(limit=10_000)}
            for span in mine.spans:
                got = stored.get((span.attempt_id, span.span_id))
                assert got is not None, f"acknowledged span {span.name} of {span.rollout_id} was lost"
                assert got.attributes == span.attributes and got.seq == int(span.name[1:]) + 1
            for res in mine.resources:
                assert await store.get_resources(res.version) == res
            stats = await store.stats()
            assert stats.spans == len(stored) and stats.resources_versions >= len(mine.resources)
            # The restarted store goes on: the queue and the version counter pick up where they were.
            (fresh,) = await store.enqueue([RolloutRequest(id="after-restart", task=Task(input=0))])
            assert fresh.seq > max(r.seq for r in found.values())
            assert (await store.add_resources()).version == stats.resources_versions + 1
        finally:
            await store.close()


async def test_store_on_a_dead_server_says_unavailable(own_redis: RedisServer) -> None:
    store = await open_store(own_redis.url)
    try:
        await store.enqueue([RolloutRequest(id="x", task=Task(input=1))])
        own_redis.kill()
        with pytest.raises(StoreUnavailableError, match="retry"):
            await store.get_rollout("x")
    finally:
        await store.close()
    with pytest.raises(StoreUnavailableError):
        await store.get_rollout("x")  # closed


# --------------------------------------------------------------------------------------------
# On the shared server: isolation, settings, concurrency
# --------------------------------------------------------------------------------------------


async def test_prefixes_isolate_stores_in_one_database(redis_url: str, redis_prefix: str) -> None:
    from lightning_rl.store.redis import RedisStore

    a = await RedisStore.open(redis_url, prefix=redis_prefix + "a:")
    b = await open_store(redis_url + f"?prefix={redis_prefix}b:")
    try:
        await a.enqueue([RolloutRequest(id="same-id", task=Task(input="a"))])
        await b.enqueue([RolloutRequest(id="same-id", task=Task(input="b"))])
        assert (await a.get_rollout("same-id")).task.input == "a"
        assert (await b.get_rollout("same-id")).task.input == "b"
        await a.add_resources(prompts={"p": "a"})
        with pytest.raises(NotFoundError, match="no resources"):
            await b.get_resources()
        assert repr(a) == f"RedisStore(prefix={redis_prefix + 'a:'!r})"
    finally:
        await a.close()
        await b.close()


async def test_open_reports_the_server_persistence(
    redis_url: str, redis_prefix: str, own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from lightning_rl.store.redis import RedisStore

    with caplog.at_level(logging.WARNING, logger="lightning_rl.store.redis"):
        durable = await RedisStore.open(own_redis.url)
    try:
        assert durable.server_settings["appendonly"] == "yes" and durable.server_settings["appendfsync"] == "always"
        assert not caplog.records
    finally:
        await durable.close()
    with redis_mod.Redis.from_url(redis_url) as client:
        keeps_nothing = client.config_get("appendonly")["appendonly"] == "no"
    with caplog.at_level(logging.WARNING, logger="lightning_rl.store.redis"):
        shared = await RedisStore.open(redis_url, prefix=redis_prefix)
    await shared.close()
    if keeps_nothing:
        assert any("appendonly yes" in r.getMessage() for r in caplog.records)


async def test_open_warns_when_the_server_may_evict_keys(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from lightning_rl.store.redis import RedisStore

    with redis_mod.Redis.from_url(own_redis.url) as client:
        client.config_set("maxmemory-policy", "allkeys-lru")
    with caplog.at_level(logging.WARNING, logger="lightning_rl.store.redis"):
        store = await RedisStore.open(own_redis.url)
    await store.close()
    assert store.server_settings["maxmemory-policy"] == "allkeys-lru"
    (record,) = caplog.records
    assert "maxmemory-policy noeviction" in record.getMessage()


async def test_bad_settings_are_invalid_requests(redis_url: str) -> None:
    from lightning_rl.errors import InvalidRequestError
    from lightning_rl.store.redis import RedisStore

    with pytest.raises(InvalidRequestError, match="prefix must not be empty"):
        await RedisStore.open(redis_url, prefix="")
    with pytest.raises(InvalidRequestError, match="max_connections"):
        await RedisStore.open(redis_url, max_connections=0)


async def test_a_prefix_with_another_layout_version_is_refused(redis_url: str, redis_prefix: str) -> None:
    from lightning_rl.store.redis import RedisStore

    with redis_mod.Redis.from_url(redis_url) as client:
        client.hset(f"{redis_prefix}meta", "schema_version", "999")
    with pytest.raises(StoreUnavailableError, match="layout version 999"):
        await RedisStore.open(redis_url, prefix=redis_prefix)


async def test_many_claimers_on_own_connections_never_share_a_rollout(redis_url: str, redis_prefix: str) -> None:
    from lightning_rl.store.redis import RedisStore

    stores = [await RedisStore.open(redis_url, prefix=redis_prefix, max_connections=2) for _ in range(16)]
    try:
        await stores[0].enqueue([RolloutRequest(id=f"c{i}", task=Task(input=i)) for i in range(600)])

        async def claimer(store: RedisStore, name: str) -> list[str]:
            got: list[str] = []
            while claims := await store.claim(name, n=2):
                got += [c.rollout.id for c in claims]
                for c in claims:
                    await store.finish_attempt(c.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
            return got

        # 64 claimers, four per connection pool, all racing over one queue.
        results = await asyncio.gather(*(claimer(stores[i % 16], f"w{i}") for i in range(64)))
        claimed = [rid for got in results for rid in got]
        assert len(claimed) == len(set(claimed)) == 600
        assert sum(1 for got in results if got) >= 8, "the claimers never raced"
        stats = await stores[0].stats()
        assert stats.rollouts_by_status == {"succeeded": 600} and stats.attempts_by_status == {"succeeded": 600}
    finally:
        for s in stores:
            await s.close()


async def test_the_same_spans_sent_at_once_by_many_clients_are_stored_once(redis_url: str, redis_prefix: str) -> None:
    from lightning_rl.store.redis import RedisStore

    stores = [await RedisStore.open(redis_url, prefix=redis_prefix) for _ in range(8)]
    try:
        await stores[0].enqueue([RolloutRequest(id="r", task=Task(input=0))])
        (claim,) = await stores[0].claim("w")
        spans = [Span(name=f"s{i}", rollout_id="r", attempt_id=claim.attempt.id) for i in range(200)]
        # Every client sends every span (a retried batch arriving from several places at once).
        added = await asyncio.gather(*(s.add_spans(spans[k::3] + spans) for k, s in enumerate(stores)))
        assert sum(added) == len(spans)
        stored = await stores[0].query_spans(attempt_id=claim.attempt.id)
        assert sorted(s.span_id for s in stored) == sorted(s.span_id for s in spans)
        assert [s.seq for s in stored] == list(range(1, len(spans) + 1))
        assert (await stores[0].stats()).spans == len(spans)
    finally:
        for s in stores:
            await s.close()


async def test_concurrent_finish_cancel_and_expiry_end_each_attempt_once(redis_url: str, redis_prefix: str) -> None:
    from lightning_rl.store.redis import RedisStore

    stores = [await RedisStore.open(redis_url, prefix=redis_prefix) for _ in range(4)]
    try:
        config = RolloutConfig(heartbeat_timeout_s=0.3)
        await stores[0].enqueue([RolloutRequest(id=f"x{i}", task=Task(input=i), config=config) for i in range(60)])
        claims = await stores[0].claim("w", n=60)
        await asyncio.sleep(0.2)

        async def finish(store: RedisStore, attempt_id: str) -> None:
            try:
                await store.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
            except ValueError:  # IllegalTransitionError: someone else ended it first
                pass

        ops = [finish(stores[i % 4], c.attempt.id) for i, c in enumerate(claims)]
        ops += [stores[(i + 1) % 4].cancel([c.rollout.id]) for i, c in enumerate(claims) if i % 2]
        ops += [stores[3].expire(time.time() + 1) for _ in range(5)]
        await asyncio.gather(*ops)
        rollouts = await stores[0].query_rollouts(limit=100)
        assert all(
            r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.CANCELLED, RolloutStatus.FAILED) for r in rollouts
        )
        stats = await stores[0].stats()
        assert sum(stats.rollouts_by_status.values()) == 60 and sum(stats.attempts_by_status.values()) == 60
        by_status: dict[str, int] = {}
        for r in rollouts:
            (attempt,) = await stores[0].query_attempts(r.id)
            by_status[attempt.status.value] = by_status.get(attempt.status.value, 0) + 1
        assert by_status == stats.attempts_by_status  # the counters agree with the records
    finally:
        for s in stores:
            await s.close()


async def test_store_serve_backend_redis(redis_url: str, redis_prefix: str) -> None:
    """``lightning-rl store serve --backend redis``: a client's writes land in Redis under the prefix."""
    from lightning_rl.store.client import StoreClient
    from lightning_rl.store.redis import RedisStore

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "lightning_rl.cli", "store", "serve", "--backend", "redis", "--redis-url", redis_url),
        *("--prefix", redis_prefix, "--port", "0"),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=60)).decode()
        assert f"serving redis (prefix {redis_prefix!r}" in line, line
        client = StoreClient(line.rsplit(" at ", 1)[1].strip())
        try:
            await client.enqueue([RolloutRequest(id="via-http", task=Task(input=1))])
            (claim,) = await client.claim("http-worker")
            await client.add_spans([Span(name="s", rollout_id="via-http", attempt_id=claim.attempt.id)])
            await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
        finally:
            await client.close()
    finally:
        proc.kill()
        await proc.wait()
    direct = await RedisStore.open(redis_url, prefix=redis_prefix)
    try:
        assert (await direct.get_rollout("via-http")).final_reward == 1.0
        assert [s.name for s in await direct.query_spans(rollout_id="via-http")] == ["s"]
    finally:
        await direct.close()


def test_docs_example_runs(redis_url: str, redis_prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The Python block of docs/stores.md, run against the test server under this test's prefix."""
    import re

    doc = (Path(__file__).parents[3] / "docs" / "stores.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    documented = "redis://127.0.0.1:6379/0?prefix=myproject:"
    assert documented in code
    exec(compile(code.replace(documented, f"{redis_url}?prefix={redis_prefix}"), "docs/stores.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "succeeded 1.0"


async def test_the_trainer_publishes_through_a_database_restart(own_redis: RedisServer) -> None:
    """Issue 45 (found by benchmarks/chaos.py): with the store server's database down, the server
    answers 503 and the client does not retry ``add_resources`` (a retry could publish twice), so
    the trainer died. ``publish_resources`` retries it for ``store_retry_s``: the run goes on."""
    from lightning_rl.store.client import StoreClient
    from lightning_rl.store.redis import RedisStore
    from lightning_rl.store.server import running_store_server
    from lightning_rl.trainer.services import publish_resources
    from lightning_rl.types import LLMResource

    llm = LLMResource(base_url="http://127.0.0.1:9/v1", model="m")
    backend = await RedisStore.open(own_redis.url)
    try:
        async with running_store_server(backend) as url, StoreClient(url) as client:
            first = await publish_resources(client, llm=llm, extra={}, retry_s=30)
            own_redis.kill()
            with pytest.raises(StoreUnavailableError):
                await client.add_resources(llm=llm)  # what the trainer called before: one 503, gone
            later = asyncio.create_task(publish_resources(client, llm=llm, extra={"n": 2}, retry_s=60))
            await asyncio.sleep(2.0)
            assert not later.done()
            own_redis.start()
            second = await asyncio.wait_for(later, 60)
            assert second.version > first.version and second.extra == {"n": 2}
    finally:
        await backend.close()
