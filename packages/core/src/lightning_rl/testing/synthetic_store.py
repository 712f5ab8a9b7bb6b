"""Fill a real store with fake calculator rollouts, recorded in the gateway's exact span shape.

``fill_fake_rollouts`` writes what a run of a tool-calling agent leaves in a store (rollouts
enqueued in task groups, claimed, two ``llm.call`` spans per attempt shaped as the gateway records
them, a reward, the attempt finished) without a model, a gateway or a runner, so exports and their
benchmarks can read tens of thousands of rollouts written in seconds. The first call asks for the
``calculator`` tool, the second reports its result; half the rollouts of a group answer right
(reward 1) and half wrong (reward 0), so SFT filters and preference pairs have something to select.
Token ids are fake (``fake_token_ids``), the text is real OpenAI chat shape.
"""

from __future__ import annotations

import json
import random
from typing import Any, Literal

from lightning_rl import semconv
from lightning_rl.store.base import LightningStore
from lightning_rl.testing.fake_upstream import fake_token_ids
from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task

__all__ = ["fill_fake_rollouts", "FAKE_CALCULATOR_TOOL"]

FAKE_CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Apply an arithmetic operation to two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "op": {"type": "string"}},
            "required": ["a", "b", "op"],
        },
    },
}
"""The tool the fake agent calls (the gateway does not record tool definitions: pass it to the export)."""


def _call_span(
    rollout_id: str, attempt_id: str, step: int, messages: list[dict[str, Any]], content: str, calls: list[Any]
) -> Span:
    prompt = json.dumps(messages)
    response = content or json.dumps(calls)
    attrs: dict[str, Any] = {
        semconv.GEN_AI_INPUT_MESSAGES: prompt,
        semconv.PROMPT_TOKEN_IDS: fake_token_ids(prompt),
        semconv.RESPONSE_TOKEN_IDS: fake_token_ids(response),
        semconv.RESPONSE_LOGPROBS: [-0.5] * len(fake_token_ids(response)),
        semconv.MODEL_VERSION: 1,
        semconv.GEN_AI_RESPONSE_ID: f"chatcmpl-{attempt_id}-{step}",
        semconv.GEN_AI_RESPONSE_FINISH_REASONS: ["tool_calls" if calls else "stop"],
        semconv.TOOL_CALLS: json.dumps(calls),
        semconv.RESPONSE_CONTENT: content or None,
        semconv.ROLE: "solver",
        semconv.TOKENS_EXACT: True,
    }
    start = 1_000_000_000 * (step + 1)
    return Span(
        name=semconv.SPAN_LLM_CALL,
        kind="client",
        start_ns=start,
        end_ns=start + 500_000_000,
        attributes=attrs,
        rollout_id=rollout_id,
        attempt_id=attempt_id,
    )


async def fill_fake_rollouts(
    store: LightningStore,
    *,
    tasks: int,
    group_size: int = 4,
    seed: int = 0,
    batch: int = 1000,
    mode: Literal["train", "val", "test"] = "train",
) -> int:
    """Write ``tasks * group_size`` finished rollouts (see the module docstring); returns how many."""
    rng = random.Random(seed)
    requests: list[RolloutRequest] = []
    for t in range(tasks):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        task = Task(input={"question": f"What is {a} * {b}?", "a": a, "b": b}, id=f"task-{t}")
        group = f"g-{t}"
        requests += [RolloutRequest(id=f"ro-{t}-{k}", task=task, group_id=group, mode=mode) for k in range(group_size)]
    written = 0
    for start in range(0, len(requests), batch):
        chunk = requests[start : start + batch]
        await store.enqueue(chunk)
        claims = await store.claim("fake-writer", n=len(chunk))
        spans: list[Span] = []
        rewards: dict[str, float] = {}
        for claim in claims:
            rollout, attempt = claim.rollout, claim.attempt
            a, b = int(rollout.task.input["a"]), int(rollout.task.input["b"])
            right = int(rollout.id.rsplit("-", 1)[1]) % 2 == 0
            answer = a * b if right else a * b + rng.randint(1, 9)
            call_id = f"call_{rollout.id}"
            question = [
                {"role": "system", "content": "Use the calculator, then answer with the number."},
                {"role": "user", "content": rollout.task.input["question"]},
            ]
            tool_call = {"id": call_id, "name": "calculator", "arguments": json.dumps({"a": a, "b": b, "op": "*"})}
            spans.append(_call_span(rollout.id, attempt.id, 0, question, "", [tool_call]))
            history = [
                *question,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": "calculator", "arguments": tool_call["arguments"]},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call_id, "content": str(a * b)},
            ]
            spans.append(_call_span(rollout.id, attempt.id, 1, history, f"The answer is {answer}.", []))
            rewards[attempt.id] = 1.0 if right else 0.0
        await store.add_spans(spans)
        for attempt_id, reward in rewards.items():
            await store.finish_attempt(attempt_id, AttemptStatus.SUCCEEDED, reward=reward)
        written += len(claims)
    return written
