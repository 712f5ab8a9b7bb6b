"""Schema-driven fuzzing of the store server's HTTP API (schemathesis over ``store_openapi()``).

The store routes live in a pure ASGI layer FastAPI does not see, so the schema is built from the
server's own route table and body models (``lightning_rl.store.server.store_openapi``). For every
operation schemathesis draws valid bodies (positive) and bodies that break the schema (negative) and
sends them to a real server over a real SQLite store. Every answer must be a non-5xx in the store's
error shape, every request must be answered within the documented limits, and afterwards the server
must still do its job (a rollout goes through enqueue, claim, spans and finish).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from lightning_rl.store.base import LightningStore  # noqa: E402
from lightning_rl.store.client import StoreClient  # noqa: E402
from lightning_rl.store.server import running_store_server, store_openapi  # noqa: E402
from lightning_rl.store.sqlite import SQLiteStore  # noqa: E402
from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task  # noqa: E402

from .serving_helpers import served_in_thread  # noqa: E402

pytestmark = pytest.mark.fuzz

EXAMPLES = 15
"""Examples per operation and mode and database: 18 operations x 2 modes x 15 = 540 requests each."""
WAIT_CAP_S = 2.0
"""Long polls answer within their ``timeout_s``; the fuzzer draws it below this so a run stays short."""
REQUEST_TIMEOUT_S = 15.0
"""No request may take longer: the longest documented wait here is ``WAIT_CAP_S``."""


def _schema() -> dict[str, Any]:
    doc = copy.deepcopy(store_openapi())
    doc["components"]["schemas"]["WaitBody"]["properties"]["timeout_s"]["maximum"] = WAIT_CAP_S
    return doc


SCHEMA = schemathesis.openapi.from_dict(_schema())
OPERATIONS = [op.ok() for op in SCHEMA.get_all_operations()]


async def _open(kind: str, db: Path, request: pytest.FixtureRequest) -> tuple[LightningStore, Callable[[], None]]:
    """The store, and how to leave nothing behind on the shared database servers."""
    name = uuid.uuid4().hex[:12]
    if kind == "postgres":
        import psycopg
        from psycopg import sql

        from lightning_rl.store.postgres import PostgresStore

        dsn: str = request.getfixturevalue("postgres_dsn")

        def drop_schema() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(f"fz_{name}")))

        return await PostgresStore.open(dsn, schema=f"fz_{name}"), drop_schema
    if kind == "redis":
        import redis

        from lightning_rl.store.redis import RedisStore

        url: str = request.getfixturevalue("redis_url")

        def drop_keys() -> None:
            with redis.Redis.from_url(url) as client:
                keys = list(client.scan_iter(match=f"fz-{name}:*", count=1000))
                for i in range(0, len(keys), 1000):
                    client.delete(*keys[i : i + 1000])

        return await RedisStore.open(url, prefix=f"fz-{name}:"), drop_keys
    return SQLiteStore(db), lambda: None


@pytest.fixture(
    scope="module",
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis", marks=pytest.mark.redis),
    ],
)
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real store server over each database: their drivers refuse different values (PostgreSQL: NUL bytes)."""
    db: Path = tmp_path_factory.mktemp("fuzz-store") / "store.db"
    kind: str = request.param
    cleanup: list[Callable[[], None]] = []

    class _Served:
        async def __aenter__(self) -> str:
            self.store, drop = await _open(kind, db, request)
            cleanup.append(drop)
            self.cm = running_store_server(self.store)
            return await self.cm.__aenter__()

        async def __aexit__(self, *exc: object) -> None:
            await self.cm.__aexit__(None, None, None)
            await self.store.close()

    try:
        with served_in_thread(_Served) as (url, _loop):
            yield url
    finally:
        for drop in cleanup:
            drop()


def check_answer(case: Any, response: Any) -> None:
    """No 5xx; a 4xx carries ``{"error": {"type", "message"}}`` with a message that says something."""
    case.validate_response(response, checks=[not_a_server_error])
    if 400 <= response.status_code < 500:
        error = response.json()["error"]
        assert error["type"] and error["message"], response.text


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_no_server_error(operation: Any, mode: GenerationMode, store_url: str) -> None:
    if mode is GenerationMode.NEGATIVE and not len(operation.body):
        pytest.skip("nothing to break: the only input is a path segment, and any string is a valid id")

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    def fuzz(case: Any) -> None:
        response = case.call(base_url=store_url, timeout=REQUEST_TIMEOUT_S)
        check_answer(case, response)

    fuzz()


async def test_still_serves_after_fuzzing(store_url: str) -> None:
    """Runs after the fuzzers (same module-scoped server): the whole lifecycle still works."""
    async with StoreClient(store_url) as client:
        assert await client.health()
        [rollout] = await client.enqueue([RolloutRequest(id="after-fuzz", task=Task(input={"q": 1}))])
        claim = None
        while claim is None:  # the fuzzers left queued rollouts ahead of ours: end them as they come
            claims = await client.claim("after-fuzz-worker", n=100)
            assert claims, "the rollout enqueued after fuzzing never became claimable"
            for c in claims:
                if c.rollout.id == rollout.id:
                    claim = c
                else:
                    await client.finish_attempt(c.attempt.id, AttemptStatus.FAILED, error="fuzz leftover")
        span = Span(name="after", rollout_id=rollout.id, attempt_id=claim.attempt.id)
        assert await client.add_spans([span]) == 1
        done = await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
        assert done.status.value == "succeeded" and done.final_reward == 1.0
        assert [s.span_id for s in await client.query_spans(attempt_id=claim.attempt.id)] == [span.span_id]
