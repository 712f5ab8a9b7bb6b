"""The agent of the dashboard tests' training run: two roles, one frozen, an AIR signal, a reward.

A writer answers, a critic (declared untrainable, as a plugin would with ``trainable=[...]``)
comments; a "tool error" signal is emitted on the writer's call when its answer is short, so the
transitions view has a trainable call with AIR reward, a frozen call and a group advantage to show.
"""

from __future__ import annotations

from typing import Any

from lightning_rl import semconv
from lightning_rl.agent import LLM
from lightning_rl.tracing import emit_signal, emit_span


async def two_role_agent(task: dict[str, Any], llm: LLM) -> float:
    writer = llm.for_role("writer").async_openai_client(max_retries=0)
    critic = llm.for_role("critic").async_openai_client(max_retries=0)
    try:
        emit_span(semconv.SPAN_AGENT, {semconv.ROLE: "writer", semconv.TRAINABLE: True})
        emit_span(semconv.SPAN_AGENT, {semconv.ROLE: "critic", semconv.TRAINABLE: False})
        reply = await writer.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
        answer = reply.choices[0].message.content or ""
        if len(answer) % 2 == 0:
            emit_signal("tool_error", 1.0, role="writer", tool_name="lookup")
        await critic.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": f"Is this good? {answer}"}], **dict(llm.sampling)
        )
    finally:
        await writer.close()
        await critic.close()
    return (len(answer) % 5) / 4
