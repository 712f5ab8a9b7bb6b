"""Agents loaded by ``lightning-rl runner --capture ... --agent capture_agents:<name>`` in the runner test.

This folder is put on the worker's ``PYTHONPATH``. The agent calls the OpenAI-compatible endpoint
named in its task (a "hosted" model, not the gateway), exactly as user code would: nothing in it
knows about Lightning except the reward it returns.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from lightning_rl.agent import LLM

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


async def hosted_adder(task: dict[str, Any], llm: LLM) -> float:
    """Asks the hosted model to add, runs the tool it asks for, returns 1.0 if the answer has the sum."""
    client = openai.AsyncOpenAI(base_url=task["url"], api_key="sk-hosted", max_retries=0)
    try:
        messages: list[Any] = [{"role": "user", "content": f"{task['a']}+{task['b']}?"}]
        first = await client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        message = first.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            args = json.loads(call.function.arguments)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownArgumentType]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
        second = await client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        return 1.0 if str(task["a"] + task["b"]) in (second.choices[0].message.content or "") else 0.0
    finally:
        await client.close()
