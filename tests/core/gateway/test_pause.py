"""Pause and drain around a weight swap: no call lost, none answered by one version and recorded as another.

The upstream (``FakeUpstream``, slow on purpose) answers with the version of the weights it holds;
the gateway records the version it was told (``/admin/weights``). A call in flight across an
unguarded swap would be answered by version 0 and recorded as version 1: the pause exists so that
never happens.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from lightning_rl import semconv as sc
from lightning_rl.gateway import UpstreamBackend, create_gateway_app, running_gateway
from lightning_rl.semconv import RESPONSE_TEXT
from lightning_rl.store import MemoryStore
from lightning_rl.testing import FakeReply, FakeUpstream

from .conftest import claim_attempts, rollout_url

ADMIN = {"authorization": "Bearer admin-secret"}


async def test_a_weight_swap_behind_a_pause_loses_no_call_and_mixes_no_versions(store: MemoryStore) -> None:
    weights = {"version": 0}  # what the gateway assumes at start

    def answer(body: dict[str, Any]) -> FakeReply:
        return FakeReply(f"v{weights['version']}", delay_s=0.2)

    fake = FakeUpstream(responder=answer, model="m")
    claims = await claim_attempts(store, 16)
    async with running_gateway(fake.app) as up:
        app = create_gateway_app(UpstreamBackend(up, model="m"), store=store, admin_token="admin-secret")
        gw = app.state.gateway
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:

            async def call(i: int) -> httpx.Response:
                body = {"model": "m", "messages": [{"role": "user", "content": str(i)}], "stream": i % 2 == 1}
                return await http.post(f"{rollout_url(url, claims[i])}/chat/completions", json=body)

            before = [asyncio.create_task(call(i)) for i in range(8)]
            while gw.in_flight + gw.opening < 8:  # all eight reached the upstream
                await asyncio.sleep(0.01)
            paused = await http.post(f"{url}/admin/pause", headers=ADMIN)
            assert paused.json() == {"paused": True, "drained": True, "in_flight": 0}
            assert all(t.done() for t in before)  # the pause returned only once they had ended

            after = [asyncio.create_task(call(i)) for i in range(8, 16)]
            while gw.held < 8:  # they arrived and are held, not refused
                await asyncio.sleep(0.01)
            assert len(fake.requests) == 8 and not any(t.done() for t in after)
            metrics = (await http.get(f"{url}/metrics", params={"format": "json"})).json()
            assert metrics["paused"] == 1 and metrics["calls_held"] == 8

            weights["version"] = 1  # the swap: the server's weights, then the gateway's version
            swapped = await http.post(f"{url}/admin/weights", headers=ADMIN, json={"version": 1})
            assert swapped.status_code == 200
            resumed = await http.post(f"{url}/admin/resume", headers=ADMIN)
            assert resumed.json() == {"paused": False, "released": 8}
            responses = await asyncio.gather(*before, *after)
        assert all(r.status_code == 200 and "error" not in r.text for r in responses)
        await gw.writer.flush(10.0)
    spans = [s for c in claims for s in await store.query_spans(rollout_id=c.rollout.id)]
    assert len(spans) == 16  # no call lost
    versions = sorted((s.attributes[RESPONSE_TEXT], s.attributes[sc.MODEL_VERSION]) for s in spans)
    assert versions == [("v0", 0)] * 8 + [("v1", 1)] * 8  # each answered and recorded by one version


async def test_pause_times_out_when_a_call_does_not_end_and_resume_serves_the_held_calls(store: MemoryStore) -> None:
    fake = FakeUpstream([FakeReply("slow", delay_s=1.0), "held"], model="m")
    async with running_gateway(fake.app) as up:
        app = create_gateway_app(UpstreamBackend(up, model="m"), admin_token="admin-secret")
        gw = app.state.gateway
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
            body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            slow = asyncio.create_task(http.post(f"{url}/v1/chat/completions", json=body))
            while gw.in_flight < 1:
                await asyncio.sleep(0.01)
            paused = await http.post(f"{url}/admin/pause", headers=ADMIN, json={"timeout_s": 0.05})
            assert paused.json() == {"paused": True, "drained": False, "in_flight": 1}
            held = asyncio.create_task(http.post(f"{url}/v1/chat/completions", json=body))
            bad = await http.post(f"{url}/admin/pause", headers=ADMIN, json={"timeout_s": "soon"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "timeout_s"
            refused = await http.post(f"{url}/admin/resume")  # the admin routes need the admin token
            assert refused.status_code == 401
            await http.post(f"{url}/admin/resume", headers=ADMIN)
            answers = [r.json()["choices"][0]["message"]["content"] for r in await asyncio.gather(slow, held)]
    assert answers == ["slow", "held"]
