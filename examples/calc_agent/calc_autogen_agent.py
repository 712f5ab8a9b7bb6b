"""The Calc-X agent: an ordinary AutoGen ``AssistantAgent`` with a calculator tool, plus one plugin line.

``build_agent`` is the agent as anyone would write it with AutoGen. ``calc_agent`` is what the
trainer runs per task: it builds the agent on a model client configured for production (any
``base_url`` and model name; the plugin routes the calls to the rollout's gateway during training),
wraps it (the only Lightning line), runs it on the question and scores the final answer.

A calculator error (a malformed or non-arithmetic expression, a division by zero) comes back to the
model as an error result; the plugin records it as a ``tool_error`` signal on the model call that
asked for it, so AIR can penalise that call alone.
"""

from __future__ import annotations

import os
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient
from calc_tasks import evaluate, score_answer

from lightning_autogen import wrap
from lightning_rl import LLM

__all__ = ["AGENT_NAME", "SYSTEM_PROMPT", "calculator", "build_agent", "model_client", "calc_agent"]

AGENT_NAME = "calc_agent"
SYSTEM_PROMPT = "Use the calculator, then give the answer."
# Where the agent's model lives in production; during training the plugin sends the calls to the gateway.
BASE_URL = os.environ.get("CALC_AGENT_BASE_URL", "http://localhost:8000/v1")
MODEL = os.environ.get("CALC_AGENT_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
MODEL_INFO = ModelInfo(
    vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN, structured_output=False
)


def calculator(expression: str) -> str:
    """Compute an arithmetic expression, e.g. 12 * 4 - 7."""
    value = evaluate(expression)
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


def build_agent(client: OpenAIChatCompletionClient) -> AssistantAgent:
    """The agent: one calculator tool; after the tool result it answers in words (``reflect_on_tool_use``)."""
    return AssistantAgent(
        AGENT_NAME,
        model_client=client,
        tools=[calculator],
        system_message=SYSTEM_PROMPT,
        reflect_on_tool_use=True,
    )


def model_client(**create_args: Any) -> OpenAIChatCompletionClient:
    """The production model client (``create_args``: sampling such as ``temperature``, ``max_tokens``)."""
    return OpenAIChatCompletionClient(
        model=MODEL,
        base_url=BASE_URL,
        api_key=os.environ.get("OPENAI_API_KEY", "unused"),
        model_info=MODEL_INFO,
        max_retries=0,
        **create_args,
    )


async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve one problem; the reward is 1.0 when the final answer states the right number."""
    client = model_client(**dict(llm.sampling))  # the trainer's sampling settings for this step
    try:
        agent = wrap(build_agent(client))  # the Lightning line: route, attribute, record tools
        result = await agent.run(task=task["question"])
    finally:
        await client.close()
    final = result.messages[-1] if result.messages else None
    return score_answer(str(getattr(final, "content", "")), float(task["answer"]))
