"""Routing of calls to rollouts (path, headers, roles), concurrency, weight swaps, metrics and auth."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import httpx
import openai
import pytest
import torch
from starlette.types import Receive, Scope, Send

from lightning_rl import semconv as sc
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.gateway import create_gateway_app, running_gateway
from lightning_rl.gateway.app import _GatewayApp  # pyright: ignore[reportPrivateUsage]
from lightning_rl.store import MemoryStore
from lightning_rl.store.sqlite import SQLiteStore

from .conftest import LIMITS, Gateway, claim_attempts, rollout_url

MESSAGES = [{"role": "user", "content": "hello"}]


async def test_path_headers_and_roles_route_calls(gateway: Gateway, engine: TransformersEngine) -> None:
    a, b, c = await claim_attempts(gateway.store, 3)
    body = {"model": engine.model_name, "messages": MESSAGES, "max_tokens": 3}
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{rollout_url(gateway.url, a)}/chat/completions", json=body)
        assert r.status_code == 200
        r = await http.post(
            f"{rollout_url(gateway.url, a)}/chat/completions", json=body, headers={"X-Lightning-Role": "critic"}
        )
        assert r.status_code == 200
        r = await http.post(
            f"{rollout_url(gateway.url, a).removesuffix('/v1')}/roles/planner/v1/chat/completions", json=body
        )
        assert r.status_code == 200
        headers = {
            "X-Lightning-Rollout": b.rollout.id,
            "X-Lightning-Attempt": b.attempt.id,
            "X-Lightning-Role": "coder",
            "X-Lightning-Key": str(b.attempt.gateway_key),
        }
        assert (await http.post(f"{gateway.v1}/chat/completions", json=body, headers=headers)).status_code == 200
        # rollout only: the gateway looks up the running attempt in the store (the key is still needed)
        key = {"X-Lightning-Key": str(c.attempt.gateway_key)}
        r = await http.post(f"{gateway.url}/rollouts/{c.rollout.id}/v1/chat/completions", json=body, headers=key)
        assert r.status_code == 200
        # outside any rollout: served, not recorded
        assert (await http.post(f"{gateway.v1}/chat/completions", json=body)).status_code == 200
    await asyncio.sleep(0.05)  # the attempt look-up runs in the background
    await gateway.flush()
    spans_a = await gateway.store.query_spans(rollout_id=a.rollout.id)
    assert [s.attributes.get(sc.ROLE) for s in spans_a] == [None, "critic", "planner"]
    [span_b] = await gateway.store.query_spans(rollout_id=b.rollout.id)
    assert span_b.attempt_id == b.attempt.id and span_b.attributes[sc.ROLE] == "coder"
    [span_c] = await gateway.store.query_spans(rollout_id=c.rollout.id)
    assert span_c.attempt_id == c.attempt.id
    assert len(await gateway.store.query_spans()) == 5
    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"{gateway.url}/metrics?format=json")).json()
    assert metrics["calls_recorded_total"] == 5 and metrics["spans_written_total"] == 5


async def test_32_concurrent_clients_over_4_rollouts_sqlite(engine: TransformersEngine, tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "store.db"))
    claims = await claim_attempts(store, 4)
    app = create_gateway_app(engine, store=store, config=LIMITS)
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=120) as http:

        async def agent(i: int) -> str:
            claim = claims[i % 4]
            body = {"model": engine.model_name, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}
            if i % 2:
                body["stream"] = True
            r = await http.post(f"{rollout_url(url, claim)}/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return claim.rollout.id

        owners = await asyncio.gather(*(agent(i) for i in range(32)))
        assert await app.state.gateway.writer.flush(10.0)
        for claim in claims:
            spans = await store.query_spans(rollout_id=claim.rollout.id)
            assert len(spans) == owners.count(claim.rollout.id) == 8
            assert {s.attempt_id for s in spans} == {claim.attempt.id}
            assert {s.attributes[sc.ROLLOUT_ID] for s in spans} == {claim.rollout.id}
            users = {s.attributes["gen_ai.input.messages"] for s in spans}
            assert len(users) == 8  # eight different agents, none mixed up
    assert app.state.gateway.writer.stats().dropped == 0
    await store.close()


async def test_weight_swap_during_traffic(tiny_model_path: Path, tmp_path: Path) -> None:
    engine = TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8)
    store = MemoryStore()
    [claim] = await claim_attempts(store, 1)
    config = dataclasses.replace(LIMITS, weights_dir=str(tmp_path))
    app = create_gateway_app(engine, store=store, config=config, admin_token="adm1n")
    admin = {"authorization": "Bearer adm1n"}
    weights = tmp_path / "v1.pt"
    torch.save({k: v * 0.5 for k, v in engine.model.state_dict().items()}, weights)
    try:
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=120) as http:
            body = {"model": engine.model_name, "messages": MESSAGES, "max_tokens": 6}
            target = f"{rollout_url(url, claim)}/chat/completions"

            async def traffic(k: int) -> list[int]:
                codes = []
                for _ in range(k):
                    codes.append((await http.post(target, json=body)).status_code)
                return codes

            async def swap() -> httpx.Response:
                await asyncio.sleep(0.3)
                return await http.post(f"{url}/admin/weights", json={"path": str(weights), "version": 1}, headers=admin)

            *codes, swapped = await asyncio.gather(*(traffic(6) for _ in range(4)), swap())
            assert swapped.status_code == 200 and swapped.json() == {"version": 1}
            assert all(c == 200 for batch in codes for c in batch)
            after = await http.post(target, json=body)
            assert after.status_code == 200
            bad = await http.post(
                f"{url}/admin/weights", json={"path": str(tmp_path / "nope.pt"), "version": 2}, headers=admin
            )
            assert bad.status_code == 400 and "nope.pt" in bad.json()["error"]["message"]
            assert await app.state.gateway.writer.flush(10.0)
        spans = await store.query_spans(rollout_id=claim.rollout.id)
        versions = [s.attributes[sc.MODEL_VERSION] for s in spans]
        assert len(spans) == 25 and set(versions) == {0, 1} and versions[-1] == 1
        assert engine.version == 1
    finally:
        engine.close()
        await store.close()


@pytest.mark.parametrize("sent", [None, "Bearer wrong"])
async def test_token_is_required_when_set(engine: TransformersEngine, sent: str | None) -> None:
    app = create_gateway_app(engine, token="s3cret", config=LIMITS)
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=60) as http:
        headers = {"authorization": sent} if sent else {}
        r = await http.get(f"{url}/v1/models", headers=headers)
        assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
        r = await http.post(f"{url}/admin/weights", json={"version": 1}, headers=headers)
        assert r.status_code == 403  # no admin token configured: the admin endpoints are off
        # the model-call routes are served by the gateway's own fast path: it must check the token too
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for path in ("/v1/chat/completions", "/rollouts/r1/attempts/a1/v1/chat/completions"):
            r = await http.post(f"{url}{path}", json=body, headers=headers)
            assert r.status_code == 401, path
        r = await http.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, headers=headers)
        assert r.status_code == 401
        ok = await http.get(f"{url}/v1/models", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        ok = await http.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200


async def test_model_calls_skip_asgi_on_the_gateway_s_own_server(
    gateway: Gateway, engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served by ``running_gateway``, model calls go from the HTTP protocol to the handler directly;
    other routes, streams and errors still answer through the ASGI app."""
    through_asgi: list[str] = []
    original = _GatewayApp.__call__

    async def counting(self: _GatewayApp, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            through_asgi.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(_GatewayApp, "__call__", counting)
    [claim] = await claim_attempts(gateway.store, 1)
    client = gateway.client(rollout_url(gateway.url, claim))
    await client.models.list()
    r = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
    assert r.choices[0].message.content is not None
    stream = await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, max_tokens=3, stream=True)  # type: ignore[arg-type]
    assert [c async for c in stream]
    with pytest.raises(openai.BadRequestError):  # n beyond the configured limit: an error response
        await client.chat.completions.create(model=engine.model_name, messages=MESSAGES, n=9)  # type: ignore[arg-type]
    assert through_asgi == [rollout_url("", claim) + "/models"]
    await gateway.flush()
    assert len(await gateway.store.query_spans(rollout_id=claim.rollout.id)) == 2  # the call and the stream


async def test_metrics_prometheus_text(gateway: Gateway) -> None:
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{gateway.url}/metrics")).text
    for name in ("spans_written_total", "spans_dropped_total", "spans_pending", "span_write_retries_total"):
        assert f"lightning_gateway_{name} " in text
