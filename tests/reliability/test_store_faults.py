"""Issue 26, store side: each defect found from outside, reproduced as a test.

Real components only: SQLite files, ``lightning-rl store serve`` and ``lightning-rl runner`` as
processes, uvicorn servers, raw HTTP with httpx (so the bodies are exactly what a client could send).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from lightning_rl.errors import InvalidRequestError
from lightning_rl.store.client import StoreClient
from lightning_rl.store.server import running_store_server
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import AttemptStatus, LLMResource, RolloutRequest, RolloutStatus, Span, Task

AGENTS = Path(__file__).parent  # holds reliability_agents.py


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AGENTS), os.environ.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lightning_rl.cli", *args]


@pytest.fixture
async def sqlite(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(tmp_path / "store.db")
    await store.add_resources(llm=LLMResource(base_url="http://127.0.0.1:9", model="tiny"))
    yield store
    await store.close()


@pytest.fixture
async def served(sqlite: SQLiteStore) -> AsyncIterator[str]:
    async with running_store_server(sqlite) as url:
        yield url


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; any still alive at the end are killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


async def _until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not (condition() if callable(condition) else condition):  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------------------------
# 1. a rollout whose worker dies never stays running
# --------------------------------------------------------------------------------------------


async def test_a_killed_runner_does_not_leave_its_rollout_running_forever(
    sqlite: SQLiteStore, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    """The issue's reproduction: default rollout config, ``runner --timeout 5``, kill -9."""
    marker = tmp_path / "running"
    await sqlite.enqueue([RolloutRequest(id="ro-orphan", task=Task(input={"marker": str(marker)}))])
    runner = subprocess.Popen(
        _cli("runner", "--store", str(tmp_path / "store.db"), "--agent", "reliability_agents:hang", "--timeout", "5"),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    procs.append(runner)
    await _until(lambda: marker.exists() or runner.poll() is not None, 30, "the runner to start the rollout")
    assert marker.exists(), runner.stderr.read() if runner.stderr else ""
    (attempt,) = await sqlite.query_attempts("ro-orphan")
    assert attempt.timeout_s == 5.0  # the runner's --timeout reached the store
    assert attempt.deadline == pytest.approx(attempt.started_at + 5.0)
    runner.send_signal(signal.SIGKILL)
    assert runner.wait(10) == -signal.SIGKILL

    (ended,) = await sqlite.wait_for_rollouts(["ro-orphan"], timeout_s=15)
    assert ended.status is RolloutStatus.TIMED_OUT
    assert time.time() - attempt.started_at < 5.0 + 10.0
    (lost,) = await sqlite.query_attempts("ro-orphan")
    assert lost.status is AttemptStatus.TIMED_OUT
    assert lost.error is not None and "--timeout" in lost.error and "5 s" in lost.error


async def test_an_old_sqlite_file_gets_the_new_column_and_deadlines(tmp_path: Path) -> None:
    """A store file written before attempts had a deadline by default: running attempts get one on open."""
    import sqlite3

    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    await store.enqueue([RolloutRequest(id="r1", task=Task(input=1))])
    (claim,) = await store.claim("w")
    await store.close()
    with sqlite3.connect(path) as conn:  # make it look like the old schema and an old, deadline-less attempt
        conn.execute("ALTER TABLE attempts DROP COLUMN timeout_s")
        conn.execute("UPDATE attempts SET deadline = NULL")
    conn.close()
    reopened = SQLiteStore(path)
    try:
        attempt = await reopened.get_attempt(claim.attempt.id)
        assert attempt.deadline == pytest.approx(attempt.heartbeat_at + 60.0) and attempt.timeout_s is None
    finally:
        await reopened.close()


async def test_an_old_postgres_schema_gets_the_new_columns_and_deadlines(
    postgres_dsn: str, postgres_schema: str
) -> None:
    """The same upgrade on PostgreSQL, by two openers at once (the columns are added once, under a lock)."""
    import psycopg
    from psycopg import sql

    from lightning_rl.store.postgres import PostgresStore

    store = await PostgresStore.open(postgres_dsn, schema=postgres_schema)
    await store.enqueue([RolloutRequest(id="r1", task=Task(input=1))])
    (claim,) = await store.claim("w")
    await store.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # the old schema, an old deadline-less attempt
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(postgres_schema)))
        conn.execute("ALTER TABLE attempts DROP COLUMN timeout_s, DROP COLUMN gateway_key")
        conn.execute("UPDATE attempts SET deadline = NULL")
    first, second = await asyncio.gather(*(PostgresStore.open(postgres_dsn, schema=postgres_schema) for _ in "ab"))
    try:
        attempt = await second.get_attempt(claim.attempt.id)
        assert attempt.deadline == pytest.approx(attempt.heartbeat_at + 60.0)
        assert attempt.timeout_s is None and attempt.gateway_key is None
    finally:
        await first.close()
        await second.close()


# --------------------------------------------------------------------------------------------
# 3. no 500s from the store server
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c", '
        b'"spanId": "b7ad6b7169203331", "name": "x", "attributes": [{"key": "k", "value": '
        + b'{"kvlistValue": {"values": [{"key": "k", "value": ' * 40
        + b'{"stringValue": "deep"}'
        + b"}]}}" * 40
        + b"}]}]}]}]}",
    ],
    ids=["nested-arrays", "nested-attribute-values"],
)
async def test_otlp_json_nested_too_deeply_is_a_400(served: str, body: bytes) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.post(f"{served}/v1/traces", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 400, answer.text
        assert "deep" in answer.json()["error"]["message"]  # says what is wrong
        assert (await http.get(f"{served}/health")).status_code == 200  # and the server is fine


async def test_a_wait_in_flight_when_the_store_stops_ends_with_an_answer(sqlite: SQLiteStore) -> None:
    await sqlite.enqueue([RolloutRequest(id="r1", task=Task(input=1))])
    async with httpx.AsyncClient() as http:
        async with running_store_server(sqlite) as url:
            waiting = asyncio.create_task(http.post(f"{url}/rollouts/wait", json={"ids": ["r1"], "timeout_s": 60}))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            stopped_at = time.monotonic()
        answer = await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - stopped_at < 3.0  # not held until uvicorn's graceful timeout
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"rollouts": []}  # nothing had ended: the same answer a timeout gives


# --------------------------------------------------------------------------------------------
# 4. rewards must be finite
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400"])
async def test_a_reward_that_is_not_finite_is_refused_over_http(sqlite: SQLiteStore, served: str, raw: str) -> None:
    await sqlite.enqueue([RolloutRequest(id="r1", task=Task(input=1))])
    (claim,) = await sqlite.claim("w")
    body = '{"status": "succeeded", "reward": ' + raw + "}"
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            f"{served}/attempts/{claim.attempt.id}/finish", content=body, headers={"content-type": "application/json"}
        )
    assert answer.status_code == 400, answer.text
    assert "reward" in answer.json()["error"]["message"]
    rollout = await sqlite.get_rollout("r1")
    assert rollout.status is RolloutStatus.RUNNING and rollout.final_reward is None  # nothing recorded


async def test_the_http_client_refuses_a_reward_that_is_not_finite_before_sending(
    sqlite: SQLiteStore, served: str
) -> None:
    """JSON has no NaN: sent as is, the client's reward would arrive as null next to ``succeeded``."""
    await sqlite.enqueue([RolloutRequest(id="r1", task=Task(input=1))])
    async with StoreClient(served) as client:
        (claim,) = await client.claim("w")
        with pytest.raises(InvalidRequestError, match="reward must be a finite number"):
            await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=float("nan"))
    assert (await sqlite.get_rollout("r1")).status is RolloutStatus.RUNNING


# --------------------------------------------------------------------------------------------
# 5, 6. secrets and clean shutdown of `lightning-rl store serve`, kill -9 of the store server
# --------------------------------------------------------------------------------------------


def _start_store(path: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        _cli("store", "serve", "--path", str(path), "--port", "0", *extra),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "lightning-rl store: serving sqlite ... at http://127.0.0.1:PORT"
    if " at http" not in line:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"store server did not start: {line!r} {err}")
    return proc, line.rsplit(" at ", 1)[1].strip()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_store_serve_token_from_a_file_private_database_and_clean_exit(
    tmp_path: Path, procs: list[subprocess.Popen[str]], sig: signal.Signals
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    token_file.chmod(0o600)
    db = tmp_path / "served.db"
    proc, url = _start_store(db, _env(LIGHTNING_STORE_TOKEN_FILE=str(token_file)))
    procs.append(proc)
    assert "s3cret-token" not in " ".join(proc.args)  # type: ignore[arg-type]
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    async with httpx.AsyncClient() as http:
        for scheme in ("Bearer", "bearer", "BEARER"):  # the scheme is case-insensitive
            answer = await http.get(f"{url}/stats", headers={"authorization": f"{scheme} s3cret-token"})
            assert answer.status_code == 200, (scheme, answer.text)
        assert (await http.get(f"{url}/stats", headers={"authorization": "Bearer wrong"})).status_code == 401
        assert (await http.get(f"{url}/stats", headers={"authorization": "Basic s3cret-token"})).status_code == 401
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


async def test_the_runner_reads_the_store_token_from_the_same_variable_and_the_old_name_still_works(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "served.db"
    proc, url = _start_store(db, _env(LIGHTNING_STORE_TOKEN="tok-123"))
    procs.append(proc)
    async with StoreClient(url, token="tok-123") as client:
        await client.add_resources(llm=LLMResource(base_url="http://127.0.0.1:9", model="tiny"))
        await client.enqueue([RolloutRequest(id=f"r{i}", task=Task(input=i)) for i in range(2)])
        for i, env in enumerate(({"LIGHTNING_STORE_TOKEN": "tok-123"}, {"LIGHTNING_TOKEN": "tok-123"})):
            runner = await asyncio.create_subprocess_exec(
                *_cli("runner", "--store", url, "--agent", "reliability_agents:quick", "--until-idle"),
                "--concurrency",
                "1",
                env=_env(**env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(runner.communicate(), 60)
            assert runner.returncode == 0, err.decode()
            assert json.loads(out.decode().splitlines()[-1])["succeeded"] == (2 if i == 0 else 0)
            assert ("deprecated" in err.decode()) == ("LIGHTNING_TOKEN" in env)
        assert all(r.status is RolloutStatus.SUCCEEDED for r in await client.query_rollouts())


async def test_kill_9_of_the_store_server_loses_nothing_acknowledged(
    tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    db = tmp_path / "served.db"
    proc, url = _start_store(db, _env())
    procs.append(proc)
    acknowledged: list[str] = []
    async with StoreClient(url, retries=0) as client:
        await client.enqueue([RolloutRequest(id="r1", task=Task(input=1)), RolloutRequest(id="r2", task=Task(input=2))])
        (claim,) = await client.claim("w")

        async def write_until_killed() -> None:
            batch = 0
            while True:
                spans = [
                    Span(name=f"s{batch}-{i}", rollout_id=claim.rollout.id, attempt_id=claim.attempt.id)
                    for i in range(50)
                ]
                try:
                    await client.add_spans(spans)
                except Exception:
                    return  # the server is gone: this batch was not acknowledged
                acknowledged.extend(s.span_id for s in spans)
                batch += 1

        writer = asyncio.create_task(write_until_killed())
        await _until(lambda: len(acknowledged) >= 500, 30, "500 acknowledged spans")
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(writer, 30)
    assert proc.wait(10) == -signal.SIGKILL

    proc2, url2 = _start_store(db, _env())
    procs.append(proc2)
    async with StoreClient(url2) as client:
        stored = {s.span_id for s in await client.query_spans(attempt_id=claim.attempt.id)}
        assert set(acknowledged) <= stored
        assert (await client.get_rollout("r1")).status is RolloutStatus.RUNNING  # its deadline still applies
        assert (await client.get_rollout("r2")).status is RolloutStatus.QUEUED
        attempt = await client.get_attempt(claim.attempt.id)
        assert attempt.deadline is not None
    proc2.send_signal(signal.SIGTERM)
    assert proc2.wait(15) == 0
