"""The runner with a real gateway, on every store backend: concurrent agents call their own
per-attempt URL with the ``openai`` client, and every LLM call, role and tool signal lands on the
attempt that made it. The model behind the gateway is the scripted fake vLLM upstream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from lightning_rl import semconv
from lightning_rl.agent import LLM
from lightning_rl.gateway import UpstreamBackend, create_gateway_app, running_gateway
from lightning_rl.runner import Runner
from lightning_rl.store.base import LightningStore
from lightning_rl.testing import FakeReply, FakeToolCall, FakeUpstream
from lightning_rl.tracing import emit_signal
from lightning_rl.types import LLMResource, RolloutConfig, RolloutRequest, RolloutStatus, Task

N_ROLLOUTS = 6


@pytest.fixture
async def gateway_url(store: LightningStore) -> AsyncIterator[tuple[str, Any]]:
    # One tool call per rollout on average; which rollout gets which is up to the interleaving.
    fake = FakeUpstream(
        [FakeReply(tool_calls=[FakeToolCall("lookup", {"n": i})]) for i in range(N_ROLLOUTS)],
        model="served",
        default="final answer",
    )
    async with running_gateway(fake.app) as upstream:
        app = create_gateway_app(UpstreamBackend(f"{upstream}/v1"), store=store)
        async with running_gateway(app) as url:
            yield url, app


async def agent(task: dict[str, int], llm: LLM) -> float:
    client = llm.for_role("solver").async_openai_client(max_retries=0)
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"task {task['i']}"}]
        for _ in range(N_ROLLOUTS + 1):
            reply = await client.chat.completions.create(model=llm.model, messages=messages)  # type: ignore[arg-type]
            calls = reply.choices[0].message.tool_calls or []
            if not calls:
                return 1.0
            for call in calls:
                emit_signal("tool_success", tool_call_id=call.id)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
        return 0.0
    finally:
        await client.close()


async def test_concurrent_agents_calls_and_signals_land_on_their_own_attempt(
    store: LightningStore, gateway_url: tuple[str, Any]
) -> None:
    url, app = gateway_url
    await store.add_resources(llm=LLMResource(base_url=url, model="served"))
    requests = [
        RolloutRequest(task=Task(input={"i": i}), config=RolloutConfig(timeout_s=30)) for i in range(N_ROLLOUTS)
    ]
    ids = [r.id for r in await store.enqueue(requests)]
    stats = await Runner(store, agent, concurrency=3, poll_interval_s=0.05).run(until_idle=True)
    assert await app.state.gateway.writer.flush(10.0)  # the gateway writes its spans on its own

    assert stats.succeeded == N_ROLLOUTS
    tool_signals = 0
    for rollout in await store.query_rollouts(ids=ids):
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0
        spans = await store.query_spans(rollout_id=rollout.id)
        (attempt_id,) = {s.attempt_id for s in spans}
        llm_calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        signals = [s for s in spans if s.name == semconv.SPAN_SIGNAL]
        assert llm_calls and all(s.attributes[semconv.ROLE] == "solver" for s in llm_calls)
        requested = {c["id"] for s in llm_calls for c in json.loads(s.attributes.get(semconv.TOOL_CALLS) or "[]")}
        assert {s.attributes[semconv.GEN_AI_TOOL_CALL_ID] for s in signals} == requested
        assert len(llm_calls) == len(signals) + 1  # one call per tool round, plus the final answer
        assert all(s.attempt_id == attempt_id for s in spans)
        tool_signals += len(signals)
    assert tool_signals == N_ROLLOUTS
