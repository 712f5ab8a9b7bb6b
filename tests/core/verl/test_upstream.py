"""The gateway in front of several vLLM replicas (``ReplicaUpstream``), as with VeRL's rollout servers.

Two ``FakeUpstream`` servers stand in for VeRL's vLLM replicas (the only allowed double); the real
gateway forwards to them and must keep asking for ``return_token_ids`` so tokens stay exact.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import httpx

from lightning_rl.agent import rollout_base_url
from lightning_rl.backends.verl.upstream import ReplicaUpstream
from lightning_rl.gateway import create_gateway_app
from lightning_rl.gateway.server import running_gateway
from lightning_rl.gateway.upstreams import RetryPolicy
from lightning_rl.store import MemoryStore
from lightning_rl.testing import FakeUpstream
from lightning_rl.types import RolloutRequest, Task


async def test_calls_are_spread_over_replicas_with_exact_token_ids() -> None:
    seen: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}

    def responder(name: str) -> Any:
        def reply(body: dict[str, Any]) -> str:
            seen[name].append(body)
            return f"from {name}"

        return reply

    a, b = (
        FakeUpstream(model="policy", responder=responder("a")),
        FakeUpstream(model="policy", responder=responder("b")),
    )
    async with running_gateway(a.app) as url_a, running_gateway(b.app) as url_b:
        backend = ReplicaUpstream([url_a.removeprefix("http://"), url_b], model="policy")
        app = create_gateway_app(backend, store=MemoryStore())
        async with running_gateway(app) as gw, httpx.AsyncClient(base_url=f"{gw}/v1", timeout=30) as client:
            replies = await asyncio.gather(
                *(
                    client.post(
                        "/chat/completions", json={"model": "policy", "messages": [{"role": "user", "content": str(i)}]}
                    )
                    for i in range(4)
                )
            )
        await backend.load_weights(None, 7)
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    texts = sorted(r.json()["choices"][0]["message"]["content"] for r in replies)
    assert texts == ["from a", "from a", "from b", "from b"]
    assert all(body.get("return_token_ids") is True for body in seen["a"] + seen["b"])
    assert backend.version == 7 and backend.in_flight == [0, 0]


async def _rollout_urls(store: MemoryStore, gateway: str, k: int) -> list[str]:
    """The base URLs of ``k`` claimed attempts, as the runner hands them to agents."""
    await store.enqueue([RolloutRequest(task=Task(input=i)) for i in range(k)])
    claims = await store.claim("worker", n=k)
    return [rollout_base_url(gateway, c.rollout.id, c.attempt.id, c.attempt.gateway_key) for c in claims]


async def test_a_rollouts_calls_stay_on_one_replica_and_fall_back_when_it_is_down() -> None:
    served: dict[str, list[str]] = {"a": [], "b": []}  # replica -> the rollouts whose calls it answered

    def responder(name: str) -> Any:
        def reply(body: dict[str, Any]) -> str:
            served[name].append(body["messages"][0]["content"])
            return f"from {name}"

        return reply

    a = FakeUpstream(model="policy", responder=responder("a"))
    b = FakeUpstream(model="policy", responder=responder("b"))
    store = MemoryStore()
    async with AsyncExitStack() as stack:
        url_a = await stack.enter_async_context(running_gateway(a.app))
        b_stack = AsyncExitStack()
        url_b = await b_stack.enter_async_context(running_gateway(b.app))
        backend = ReplicaUpstream([url_a, url_b], model="policy", retry=RetryPolicy(tries=1))
        gw = await stack.enter_async_context(running_gateway(create_gateway_app(backend, store=store)))
        client = await stack.enter_async_context(httpx.AsyncClient(timeout=30))
        urls = await _rollout_urls(store, gw, 16)

        async def conversation(i: int, turns: int) -> None:
            for turn in range(turns):  # one turn after the other, half of them streamed
                body = {"model": "policy", "messages": [{"role": "user", "content": str(i)}], "stream": turn % 2 == 1}
                r = await client.post(f"{urls[i]}/chat/completions", json=body)
                assert r.status_code == 200 and "error" not in r.text, r.text

        await asyncio.gather(*(conversation(i, 3) for i in range(16)))
        on_b = {i for i in range(16) if str(i) in served["b"]}
        assert not on_b & {int(r) for r in served["a"]}  # no rollout was answered by both
        assert sorted(served["a"] + served["b"]) == sorted(str(i) for i in range(16) for _ in range(3))
        assert on_b and len(on_b) < 16  # the rollouts were spread over both replicas

        await b_stack.aclose()  # replica b goes away: its rollouts fall back to a
        served["a"].clear()
        await asyncio.gather(*(conversation(i, 2) for i in sorted(on_b)))
        assert sorted(served["a"]) == sorted(str(i) for i in on_b for _ in range(2))
        assert backend.down_until[1] > 0 and backend.in_flight == [0, 0]
