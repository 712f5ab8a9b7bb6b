"""Exported records in the shapes other trainers read: OpenAI fine-tuning JSONL and TRL datasets.

A transition keeps its call as text in OpenAI chat shape (``TransitionText``: the messages sent,
the response, its tool calls as ``{"id", "name", "arguments"}``). Every format here is built from
that text, so each record is what the model saw and said, never a re-rendering:

* **SFT, one record per call**: the messages sent are the prompt and the response is the one
  completion that trains. OpenAI's chat format holds both in ``messages`` and marks earlier
  assistant turns ``weight: 0`` (only the last trains); TRL's conversational *prompt-completion*
  format holds them in ``prompt`` and ``completion`` (``SFTTrainer`` trains the completion only).
* **SFT, one record per rollout**: a role's calls usually form one growing conversation (each call's
  messages are the previous call's plus its response plus tool results), so the last call's
  messages and response hold them all; an assistant turn trains (``weight: 1``) when it is one of the
  kept calls' responses, else (another role's, a frozen role's, a framework's) it is context
  (``weight: 0``). Calls that do not continue the conversation start another record. TRL's
  *conversational language modeling* format (``messages``) has no weights: ``SFTTrainer`` trains every
  assistant turn, so use one record per call when other roles' turns share the conversation.
* **Preference pairs** (``build_pairs``): OpenAI's preference format (``input``,
  ``preferred_output``, ``non_preferred_output``) and TRL's conversational preference format
  (``prompt``, ``chosen``, ``rejected``) both need one prompt for both sides, so a pair is exported
  when both calls saw the same messages (the first call of a task always does).
* **Transitions**: the exact token ids and rewards, plus ``input_ids`` and ``completion_mask``, which
  ``SFTTrainer`` takes as an already tokenized dataset (no chat template, no retokenisation).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_rl.algorithms.pairs import PreferencePair
from lightning_rl.types import Transition, TransitionText

__all__ = [
    "Record",
    "SftUnit",
    "TargetFormat",
    "openai_message",
    "sft_call_records",
    "sft_rollout_records",
    "preference_record",
    "transition_record",
]

SftUnit = Literal["call", "rollout"]
TargetFormat = Literal["openai", "trl"]


@dataclass
class Record:
    """One output line or row, the record it came from (for problem lines) and its token count."""

    data: dict[str, Any]
    ref: str
    tokens: int | None = None
    """Prompt plus response tokens where the gateway recorded them (None: text-only capture)."""


def ref_of(t: Transition) -> str:
    """How a problem line names a call: rollout, call index and span."""
    return f"rollout {t.rollout_id} call {t.step_index}" + (f" (span {t.span_id})" if t.span_id else "")


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {})


def openai_tool_calls(calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{"id", "name", "arguments"}]`` -> OpenAI's ``[{"id", "type", "function": {"name", "arguments"}}]``."""
    return [
        {
            "id": str(c.get("id") or ""),
            "type": "function",
            "function": {"name": str(c.get("name") or ""), "arguments": _arguments(c.get("arguments"))},
        }
        for c in calls
    ]


def openai_message(message: dict[str, Any]) -> dict[str, Any]:
    """A recorded message in OpenAI chat shape (only the keys fine-tuning accepts)."""
    role = str(message.get("role") or "")
    content = message.get("content")
    out: dict[str, Any] = {"role": role, "content": content if isinstance(content, str) else None}
    calls = message.get("tool_calls")
    if role == "assistant" and isinstance(calls, list) and calls:
        out["tool_calls"] = openai_tool_calls(calls)  # pyright: ignore[reportUnknownArgumentType]
        if not out["content"]:
            out["content"] = None
    if role == "tool" and message.get("tool_call_id"):
        out["tool_call_id"] = str(message["tool_call_id"])
    if out["content"] is None and "tool_calls" not in out:
        out["content"] = ""
    return out


def response_message(text: TransitionText) -> dict[str, Any]:
    """The call's response as an assistant message."""
    return openai_message({"role": "assistant", "content": text.response, "tool_calls": text.tool_calls})


def _tokens(t: Transition) -> int | None:
    return len(t.prompt_ids) + len(t.response_ids) if t.prompt_ids else None


def _tools(text: TransitionText, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    return tools if tools is not None else text.tools


def _shape(
    fmt: TargetFormat, prompt: list[dict[str, Any]], completion: dict[str, Any], tools: list[dict[str, Any]] | None
) -> dict[str, Any]:
    if fmt == "trl":
        return {"prompt": prompt, "completion": [completion], "tools": json.dumps(tools) if tools else None}
    history = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in prompt]
    data: dict[str, Any] = {"messages": [*history, completion]}
    if tools:
        data["tools"] = tools
    return data


def sft_call_records(
    transitions: Sequence[Transition], fmt: TargetFormat, tools: list[dict[str, Any]] | None = None
) -> tuple[list[Record], list[str]]:
    """One record per call; calls without recorded text are named in the second list."""
    records: list[Record] = []
    missing: list[str] = []
    for t in transitions:
        if t.text is None:
            missing.append(f"{ref_of(t)}: no text was recorded for this call; it cannot be exported as chat")
            continue
        prompt = [openai_message(m) for m in t.text.messages]
        records.append(
            Record(_shape(fmt, prompt, response_message(t.text), _tools(t.text, tools)), ref_of(t), _tokens(t))
        )
    return records, missing


def _same_turn(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def key(m: dict[str, Any]) -> tuple[str, str, list[tuple[str, str]]]:
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
        return (m["role"], m.get("content") or "", calls)

    return key(a) == key(b)


def _continues(earlier: list[dict[str, Any]], later: list[dict[str, Any]]) -> bool:
    return len(later) >= len(earlier) and all(_same_turn(a, b) for a, b in zip(earlier, later, strict=False))


def sft_rollout_records(
    transitions: Sequence[Transition], fmt: TargetFormat, tools: list[dict[str, Any]] | None = None
) -> tuple[list[Record], list[str]]:
    """One record per conversation of a role in one rollout (see the module docstring)."""
    missing: list[str] = []
    # chains[i] = (role, calls); a call joins the latest chain of its role whose full conversation it continues
    chains: list[tuple[str | None, list[Transition]]] = []
    for t in transitions:
        if t.text is None:
            missing.append(f"{ref_of(t)}: no text was recorded for this call; it cannot be exported as chat")
            continue
        messages = [openai_message(m) for m in t.text.messages]
        for role, calls in reversed(chains):
            last = calls[-1]
            assert last.text is not None
            seen = [openai_message(m) for m in last.text.messages] + [response_message(last.text)]
            if role == t.role and _continues(seen, messages):
                calls.append(t)
                break
        else:
            chains.append((t.role, [t]))
    records: list[Record] = []
    for _role, calls in chains:
        last = calls[-1]
        assert last.text is not None
        trained = [response_message(c.text) for c in calls[:-1] if c.text is not None]
        history: list[dict[str, Any]] = []
        for m in (openai_message(m) for m in last.text.messages):
            if m["role"] == "assistant":
                hit = next((i for i, r in enumerate(trained) if _same_turn(r, m)), None)
                if hit is not None:
                    trained.pop(hit)
                m = {**m, "weight": 1 if hit is not None else 0}
            history.append(m)
        final = {**response_message(last.text), "weight": 1}
        messages = [*history, final]
        the_tools = _tools(last.text, tools)
        if fmt == "trl":
            data: dict[str, Any] = {
                "messages": [{k: v for k, v in m.items() if k != "weight"} for m in messages],
                "tools": json.dumps(the_tools) if the_tools else None,
            }
        else:
            data = {"messages": messages}
            if the_tools:
                data["tools"] = the_tools
        tokens = _tokens(last)
        ref = f"rollout {last.rollout_id} role {last.role or '-'} calls {calls[0].step_index}-{last.step_index}"
        records.append(Record(data, ref, tokens))
    return records, missing


def preference_record(
    pair: PreferencePair, fmt: TargetFormat, tools: list[dict[str, Any]] | None = None
) -> Record | str:
    """One pair as a record, or why it cannot be one (a line naming both calls)."""
    [chosen], [rejected] = pair.chosen, pair.rejected
    ref = f"pair {ref_of(chosen)} over {ref_of(rejected)}"
    if chosen.text is None or rejected.text is None:
        return f"{ref}: no text was recorded for one side; it cannot be exported as chat"
    prompt = [openai_message(m) for m in chosen.text.messages]
    if prompt != [openai_message(m) for m in rejected.text.messages]:
        return f"{ref}: the two calls saw different messages; a preference pair needs one prompt for both sides"
    yes, no = response_message(chosen.text), response_message(rejected.text)
    the_tools = _tools(chosen.text, tools)
    tokens = None
    if chosen.prompt_ids and rejected.prompt_ids:
        tokens = len(chosen.prompt_ids) + max(len(chosen.response_ids), len(rejected.response_ids))
    if fmt == "trl":
        return Record({"prompt": prompt, "chosen": [yes], "rejected": [no]}, ref, tokens)
    data: dict[str, Any] = {"input": {"messages": prompt}, "preferred_output": [yes], "non_preferred_output": [no]}
    if the_tools:
        data["input"]["tools"] = the_tools
    return Record(data, ref, tokens)


def transition_record(t: Transition, rollout_reward: float) -> Record | str:
    """A call's exact tokens and rewards, with ``input_ids`` / ``completion_mask`` for ``SFTTrainer``."""
    if not t.prompt_ids or not t.response_ids:
        return f"{ref_of(t)}: no token ids were recorded (a text-only capture); retokenize it or export sft instead"
    data: dict[str, Any] = {
        "rollout_id": t.rollout_id,
        "attempt_id": t.attempt_id,
        "task_id": t.task_id,
        "group_id": t.group_id,
        "step_index": t.step_index,
        "role": t.role,
        "model_version": t.model_version,
        "reward": rollout_reward,
        "air_reward": t.reward,
        "exact_tokens": t.exact_tokens,
        "truncated": t.truncated,
        "prompt_ids": t.prompt_ids,
        "response_ids": t.response_ids,
        "response_logprobs": t.response_logprobs,
        "input_ids": t.prompt_ids + t.response_ids,
        "completion_mask": [0] * len(t.prompt_ids) + [1] * len(t.response_ids),
    }
    return Record(data, ref_of(t), len(t.prompt_ids) + len(t.response_ids))
