"""The gateway in front of several vLLM replicas (``ReplicaUpstream``), as with VeRL's rollout servers.

Two ``FakeUpstream`` servers stand in for VeRL's vLLM replicas (the only allowed double); the real
gateway forwards to them and must keep asking for ``return_token_ids`` so tokens stay exact.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from lightning_rl.backends.verl.upstream import ReplicaUpstream
from lightning_rl.gateway import create_gateway_app
from lightning_rl.gateway.server import running_gateway
from lightning_rl.store import MemoryStore
from lightning_rl.testing import FakeUpstream


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
