"""The store over HTTP: bad input gets a clear 4xx, auth is enforced, the client retries only what it should.

The protocol's behaviour itself is covered by the contract suite (``test_contract.py``), which runs
against ``StoreClient`` too; these tests are about the HTTP layer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lightning_rl.credentials import is_loopback
from lightning_rl.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    NotFoundError,
    StoreUnavailableError,
    UnauthorizedError,
)
from lightning_rl.store import _cli
from lightning_rl.store.client import StoreClient
from lightning_rl.store.memory import MemoryStore
from lightning_rl.store.server import running_store_server
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import AttemptStatus, Claim, RolloutConfig, RolloutRequest, Span, Task


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, SQLiteStore]]:
    """A SQLite store behind a real uvicorn server on 127.0.0.1 (small body limit for the 413 tests)."""
    store = SQLiteStore(tmp_path / "store.db")
    try:
        async with running_store_server(store, max_body_bytes=64 * 1024) as url:
            yield url, store
    finally:
        await store.close()


@pytest.fixture
async def raw(served: tuple[str, SQLiteStore]) -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client, to send what StoreClient never would."""
    async with httpx.AsyncClient(base_url=served[0]) as client:
        yield client


async def claimed(store: Any, n: int = 1) -> list[Claim]:
    await store.enqueue([RolloutRequest(task=Task(input=i)) for i in range(n)])
    return await store.claim("worker-1", n)


def error_of(response: httpx.Response) -> dict[str, str]:
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    return body["error"]


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


async def test_malformed_json_is_400(raw: httpx.AsyncClient) -> None:
    response = await raw.post(
        "/rollouts/claim", content=b'{"worker_id": "w", ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "InvalidRequestError"
    assert "not valid JSON" in error["message"]


async def test_wrong_types_are_400_naming_each_field(raw: httpx.AsyncClient) -> None:
    response = await raw.post("/rollouts/claim", json={"worker_id": 5, "n": "many"})
    assert response.status_code == 400
    message = error_of(response)["message"]
    assert "worker_id" in message and "n:" in message


async def test_nested_field_and_unknown_field_are_named(raw: httpx.AsyncClient) -> None:
    response = await raw.post("/spans", json={"spans": [{"name": "x", "rollout_id": "r"}]})
    assert response.status_code == 400
    assert "spans.0.attempt_id" in error_of(response)["message"]

    response = await raw.post("/rollouts/claim", json={"worker_id": "w", "colour": "blue"})
    assert response.status_code == 400
    assert "colour" in error_of(response)["message"]


async def test_out_of_range_values_are_400_not_500(raw: httpx.AsyncClient) -> None:
    response = await raw.post("/rollouts/claim", json={"worker_id": "w", "n": 0})
    assert response.status_code == 400
    response = await raw.post("/spans/query", json={"limit": -1})
    assert response.status_code == 400
    response = await raw.get("/resources/abc")
    assert response.status_code == 400
    assert "version" in error_of(response)["message"]


async def test_oversized_body_is_413_naming_the_field(raw: httpx.AsyncClient) -> None:
    spans = [{"name": "x" * 400, "rollout_id": "r", "attempt_id": "a"} for _ in range(400)]
    response = await raw.post("/spans", json={"spans": spans})
    assert response.status_code == 413
    error = error_of(response)
    assert "spans" in error["message"] and "limit" in error["message"]


async def test_oversized_chunked_body_without_length_is_413(raw: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"spans": ['
        for _ in range(200):
            yield b'{"name": "' + b"x" * 1000 + b'", "rollout_id": "r", "attempt_id": "a"},'
        yield b"]}"

    response = await raw.post("/spans", content=chunks())
    assert response.status_code == 413


async def test_unknown_ids_are_404(served: tuple[str, SQLiteStore], raw: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/rollouts/nope"),
        ("GET", "/rollouts/nope/attempts"),
        ("GET", "/attempts/nope"),
        ("POST", "/attempts/nope/heartbeat"),
        ("GET", "/resources/7"),
    ]:
        response = await raw.request(method, path)
        assert response.status_code == 404, path
        assert error_of(response)["type"] == "NotFoundError"
    client = StoreClient(served[0])
    try:
        with pytest.raises(NotFoundError, match="nope"):
            await client.get_rollout("nope")
        with pytest.raises(NotFoundError):
            await client.add_spans([Span(name="x", rollout_id="nope", attempt_id="nope")])
    finally:
        await client.close()


async def test_unknown_route_and_wrong_method_answer_json(raw: httpx.AsyncClient) -> None:
    response = await raw.get("/no/such/route")
    assert response.status_code == 404
    assert error_of(response)["type"] == "NotFoundError"
    response = await raw.get("/rollouts/claim")  # claim is POST-only; no rollout has this id either
    assert response.status_code in (404, 405)
    error_of(response)


async def test_illegal_transition_is_409_and_raises_the_same_class(served: tuple[str, SQLiteStore]) -> None:
    client = StoreClient(served[0])
    try:
        (claim,) = await claimed(client)
        await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
        with pytest.raises(IllegalTransitionError, match="already succeeded"):
            await client.finish_attempt(claim.attempt.id, AttemptStatus.FAILED, error="late")
        with pytest.raises(IllegalTransitionError):
            await client.heartbeat(claim.attempt.id)
    finally:
        await client.close()


async def test_rollout_id_that_looks_like_a_route(served: tuple[str, SQLiteStore]) -> None:
    client = StoreClient(served[0])
    try:
        await client.enqueue([RolloutRequest(id="query", task=Task(input=1))])
        assert (await client.get_rollout("query")).id == "query"
        assert await client.query_attempts("query") == []
    finally:
        await client.close()


# --------------------------------------------------------------------------------------------
# Retries and idempotency
# --------------------------------------------------------------------------------------------


def counting_client(counter: list[str]) -> httpx.AsyncClient:
    async def count(request: httpx.Request) -> None:
        counter.append(f"{request.method} {request.url.path}")

    return httpx.AsyncClient(event_hooks={"request": [count]})


async def test_client_does_not_retry_4xx(served: tuple[str, SQLiteStore]) -> None:
    sent: list[str] = []
    async with counting_client(sent) as http:
        client = StoreClient(served[0], retries=5, backoff_s=0.01, http_client=http)
        with pytest.raises(NotFoundError):
            await client.get_rollout("missing")
        with pytest.raises(InvalidRequestError):
            await client.claim("w", n=0)
        (claim,) = await claimed(client)
        await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED)
        sent.clear()
        with pytest.raises(IllegalTransitionError):
            await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED)
    assert sent == [f"POST /attempts/{claim.attempt.id}/finish"]


async def test_client_retries_503_then_gives_up(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "closed.db")
    await store.close()  # a closed store answers StoreUnavailableError, which the server maps to 503
    sent: list[str] = []
    async with running_store_server(store) as url, counting_client(sent) as http:
        raw = await http.get(f"{url}/stats")
        assert raw.status_code == 503
        sent.clear()
        client = StoreClient(url, retries=3, backoff_s=0.01, http_client=http)
        with pytest.raises(StoreUnavailableError, match="closed"):
            await client.stats()
    assert sent == ["GET /stats"] * 4


async def test_client_retries_connection_errors_then_raises_unavailable() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sent: list[str] = []
    async with counting_client(sent) as http:
        client = StoreClient(f"http://127.0.0.1:{port}", retries=2, backoff_s=0.01, http_client=http)
        with pytest.raises(StoreUnavailableError, match="store serve"):
            await client.stats()
    assert len(sent) == 3
    default = StoreClient(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01)  # the built-in transport
    with pytest.raises(StoreUnavailableError):
        await default.get_rollout("x")
    assert not await default.health()
    await default.close()


async def test_retried_writes_do_not_duplicate(served: tuple[str, SQLiteStore]) -> None:
    client = StoreClient(served[0])
    try:
        request = RolloutRequest(id="ro-1", task=Task(input="q"))
        await client.enqueue([request])
        await client.enqueue([request])
        assert len(await client.query_rollouts()) == 1
        (claim,) = await client.claim("w")
        spans = [Span(name=f"s{i}", rollout_id="ro-1", attempt_id=claim.attempt.id) for i in range(5)]
        assert await client.add_spans(spans) == 5
        assert await client.add_spans(spans) == 0
        stored = await client.query_spans(attempt_id=claim.attempt.id)
        assert [s.name for s in stored] == [f"s{i}" for i in range(5)]
        assert [s.seq for s in stored] == [1, 2, 3, 4, 5]
    finally:
        await client.close()


async def test_many_concurrent_requests_share_the_pool(served: tuple[str, SQLiteStore]) -> None:
    client = StoreClient(served[0], max_connections=8)
    try:
        claims = await claimed(client, 50)

        async def work(claim: Claim) -> None:
            spans = [Span(name="x", rollout_id=claim.rollout.id, attempt_id=claim.attempt.id) for _ in range(3)]
            await client.add_spans(spans)
            await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=0.5)

        await asyncio.gather(*(work(c) for c in claims))
        stats = await client.stats()
        assert stats.rollouts_by_status == {"succeeded": 50}
        assert stats.spans == 150
    finally:
        await client.close()


# --------------------------------------------------------------------------------------------
# Auth and binding
# --------------------------------------------------------------------------------------------


async def test_token_is_required_on_every_route() -> None:
    store = MemoryStore()
    async with running_store_server(store, token="s3cret") as url:
        async with httpx.AsyncClient(base_url=url) as raw:
            for path in ["/health", "/stats", "/rollouts/x", "/no/such/route"]:
                response = await raw.get(path)
                assert response.status_code == 401, path
                assert error_of(response)["type"] == "UnauthorizedError"
                assert "missing" in error_of(response)["message"]
            response = await raw.post("/v1/traces", content=b"", headers={"authorization": "Bearer wrong"})
            assert response.status_code == 401
            assert "wrong" in error_of(response)["message"]
            assert (await raw.get("/health", headers={"authorization": "Bearer s3cret"})).status_code == 200

        bad = StoreClient(url, token="wrong", retries=3)
        with pytest.raises(UnauthorizedError):
            await bad.stats()
        await bad.close()
        good = StoreClient(url, token="s3cret")
        assert (await good.stats()).spans == 0
        await good.close()


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _cli.register(parser.add_subparsers())
    return parser.parse_args(["store", "serve", "--backend", "memory", *argv])


def test_non_loopback_bind_without_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_cli.TOKEN_ENV, raising=False)
    args = serve_args("--host", "0.0.0.0")
    with pytest.raises(PermissionError, match="--token"):
        args.handler(args)


def test_cli_reports_the_refusal_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_rl.cli import main

    monkeypatch.delenv(_cli.TOKEN_ENV, raising=False)
    assert main(["store", "serve", "--backend", "memory", "--host", "192.0.2.1"]) == 2
    assert "refusing to serve" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.5", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def test_server_expires_attempts_without_traffic() -> None:
    store = MemoryStore()
    async with running_store_server(store, expire_interval_s=0.1) as url:
        client = StoreClient(url)
        await client.enqueue([RolloutRequest(task=Task(input=1), config=RolloutConfig(heartbeat_timeout_s=0.2))])
        (claim,) = await client.claim("w")
        await asyncio.sleep(1.2)
        attempt = await client.get_attempt(claim.attempt.id)
        await client.close()
    assert attempt.status is AttemptStatus.TIMED_OUT
    # Expired by the server's periodic task, well before this query would have done it.
    assert attempt.ended_at is not None and attempt.ended_at < time.time() - 0.5


async def test_health(served: tuple[str, SQLiteStore]) -> None:
    client = StoreClient(served[0])
    assert await client.health()
    await client.close()
    async with httpx.AsyncClient() as raw:
        assert json.loads((await raw.get(served[0] + "/health")).content) == {"status": "ok"}


@pytest.mark.parametrize(
    ("wire", "status", "body", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", 200, b"hello", True),
        (b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", 404, b"{}", False),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n",
            200,
            b"abcde",
            True,
        ),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil eof", 200, b"until eof", False),
    ],
)
async def test_client_reads_http11_framings(wire: bytes, status: int, body: bytes, keep_alive: bool) -> None:
    """The built-in transport's response reader, on each framing a server or proxy may use."""
    from lightning_rl.store.client import _read_response  # pyright: ignore[reportPrivateUsage]

    reader = asyncio.StreamReader()
    reader.feed_data(wire)
    reader.feed_eof()
    assert await _read_response(reader) == (status, body, keep_alive)


class ResponseDroppingProxy:
    """A TCP hop in front of the store server that forwards every request but, for requests whose
    path contains ``drop``, closes the client's connection instead of relaying the answer: the write
    happened, its acknowledgement was lost (what a network cut or a proxy restart does)."""

    def __init__(self, upstream: str, drop: str) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.drop = drop.encode()
        self.dropped = 0
        self.seen: list[bytes] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from lightning_rl.store.client import _read_response  # pyright: ignore[reportPrivateUsage]

        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                request_line = head.split(b"\r\n", 1)[0]
                self.seen.append(request_line)
                up_writer.write(head + body)
                status, content, _ = await _read_response(up_reader)
                if self.drop in request_line and self.dropped == 0:
                    self.dropped += 1
                    return  # applied upstream; the client never hears back
                writer.write(
                    b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (status, len(content), content)
                )
                await writer.drain()
        finally:
            writer.close()
            up_writer.close()


async def test_lost_finish_response_is_recognised_on_retry(served: tuple[str, SQLiteStore]) -> None:
    proxy = ResponseDroppingProxy(served[0], drop="/finish")
    async with proxy as url:
        client = StoreClient(url, retries=3, backoff_s=0.01)
        (claim,) = await claimed(client)
        rollout = await client.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=0.75)
        await client.close()
    assert proxy.dropped == 1
    assert sum(b"/finish" in line for line in proxy.seen) == 2  # the retry reached the server, got 409
    assert rollout.status == "succeeded" and rollout.final_reward == 0.75


async def test_lost_add_spans_response_retry_does_not_duplicate(served: tuple[str, SQLiteStore]) -> None:
    proxy = ResponseDroppingProxy(served[0], drop="/spans")
    async with proxy as url:
        client = StoreClient(url, retries=3, backoff_s=0.01)
        (claim,) = await claimed(client)
        spans = [Span(name=f"s{i}", rollout_id=claim.rollout.id, attempt_id=claim.attempt.id) for i in range(10)]
        await client.add_spans(spans)
        await client.close()
    assert proxy.dropped == 1
    stored = await served[1].query_spans(attempt_id=claim.attempt.id)
    assert [s.name for s in stored] == [f"s{i}" for i in range(10)]


def test_each_route_binds_its_arguments_as_python_does() -> None:
    """``Route.bind`` (the client's per-request binding, cheaper than ``Signature.bind``) gives the
    arguments ``Signature.bind`` gives, defaults included, and raises its ``TypeError`` otherwise."""
    from lightning_rl.store.client import ROUTES

    def reference(route: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = route.signature.bind(None, *args, **kwargs)
        bound.apply_defaults()
        return dict(list(bound.arguments.items())[1:])

    routes = {r.name: r for r in ROUTES}
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("claim", ("w",), {}),
        ("claim", ("w", 3), {"timeout_s": 2.0}),
        ("claim", (), {"worker_id": "w", "n": 2}),
        ("finish_attempt", ("at-1", AttemptStatus.SUCCEEDED), {"reward": 1.0}),
        ("query_rollouts", (), {"status": ["queued"], "limit": 5}),
        ("get_resources", (), {}),
        ("stats", (), {}),
    ]
    for name, args, kwargs in calls:
        assert routes[name].bind(args, kwargs) == reference(routes[name], args, kwargs), name
    bad: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("claim", (), {}),  # missing
        ("claim", ("w",), {"worker_id": "v"}),  # twice
        ("claim", ("w",), {"workers": 2}),  # unknown
        ("claim", ("w", 1, 2.0, 4), {}),  # too many
        ("stats", (1,), {}),
    ]
    for name, args, kwargs in bad:
        with pytest.raises(TypeError):
            routes[name].bind(args, kwargs)
