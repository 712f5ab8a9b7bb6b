"""The target formats' rules, checked on every record before the file is written.

A hosted fine-tuning job rejects a whole file for one bad line, minutes after the upload, and a TRL
run fails mid-tokenisation; both say little about which rollout caused it. So each record is
checked here first and every problem becomes one line naming the record (rollout, call, span).

The rules are those OpenAI documents for chat and preference fine-tuning (and that the providers
sharing its API follow): roles from ``system``, ``user``, ``assistant``, ``tool``; an assistant message
has text or tool calls; a tool call is ``{"id", "type": "function", "function": {"name", "arguments"}}``
with JSON arguments; a ``tool`` message answers an earlier call's id; ``weight`` (0 or 1) only on
assistant messages and at least one assistant message trains; a preference output is one
assistant message; an example fits the model's context (``max_tokens``) and the file fits the
upload limit. TRL's conversational formats share the message rules.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

from lightning_rl.errors import LightningError

__all__ = [
    "ExportValidationError",
    "MAX_EXAMPLE_TOKENS",
    "MAX_FILE_BYTES",
    "MIN_OPENAI_EXAMPLES",
    "check_messages",
    "check_sft_openai",
    "check_preference_openai",
    "check_sft_trl",
    "check_preference_trl",
]

MAX_EXAMPLE_TOKENS = 65_536
"""OpenAI's per-example limit for its current fine-tunable chat models (gpt-4.1, gpt-4o-mini)."""
MAX_FILE_BYTES = 512 * 1024 * 1024
"""The largest file ``/v1/files`` takes for fine-tuning."""
MIN_OPENAI_EXAMPLES = 10
"""OpenAI refuses a fine-tuning job on fewer examples."""

_ROLES = ("system", "user", "assistant", "tool", "developer")
_MESSAGE_KEYS = {"role", "content", "name", "weight", "tool_calls", "tool_call_id"}


class ExportValidationError(LightningError, ValueError):
    """Records broke the target format's rules; ``problems`` holds one line per problem, naming the record."""

    def __init__(self, problems: Sequence[str], more: int = 0) -> None:
        self.problems = list(problems)
        lines = "\n".join(self.problems) + (f"\n... and {more} more" if more else "")
        super().__init__(
            f"{len(self.problems) + more} problem(s) in the export; nothing was written (pass --skip-invalid to "
            f"write the valid records and leave these out):\n{lines}"
        )


def _check_tool_calls(where: str, calls: Any) -> tuple[list[str], list[str]]:
    """Problems of one message's tool calls, and the ids they declare."""
    problems: list[str] = []
    ids: list[str] = []
    if not isinstance(calls, list) or not calls:
        return [f"{where}: tool_calls must be a non-empty list"], ids
    for j, raw in enumerate(cast(list[Any], calls)):
        at = f"{where} tool call {j}"
        if not isinstance(raw, dict):
            problems.append(f"{at}: not an object")
            continue
        call = cast(dict[str, Any], raw)
        if not call.get("id") or not isinstance(call.get("id"), str):
            problems.append(f"{at}: no id (a tool message answers a call by its id)")
        else:
            ids.append(call["id"])
        if call.get("type") != "function":
            problems.append(f"{at}: type must be 'function', got {call.get('type')!r}")
        fn = call.get("function")
        if not isinstance(fn, dict):
            problems.append(f"{at}: no function object")
            continue
        fn = cast(dict[str, Any], fn)
        if not fn.get("name") or not isinstance(fn.get("name"), str):
            problems.append(f"{at}: function has no name")
        args = fn.get("arguments")
        if not isinstance(args, str):
            problems.append(f"{at}: function arguments must be a JSON string")
        else:
            try:
                json.loads(args)
            except ValueError:
                problems.append(f"{at}: function arguments are not valid JSON: {args[:80]!r}")
    return problems, ids


def check_messages(messages: Any, *, weights: bool, where: str = "") -> list[str]:
    """The message rules shared by every chat format (``weights``: whether ``weight`` is allowed)."""
    if not isinstance(messages, list) or not messages:
        return [f"{where}messages must be a non-empty list"]
    problems: list[str] = []
    call_ids: set[str] = set()
    for i, raw in enumerate(cast(list[Any], messages)):
        at = f"{where}message {i}"
        if not isinstance(raw, dict):
            problems.append(f"{at}: not an object")
            continue
        m = cast(dict[str, Any], raw)
        role = m.get("role")
        if role not in _ROLES:
            problems.append(f"{at}: role {role!r} is not one of {', '.join(_ROLES)}")
        unknown = sorted(k for k, v in m.items() if k not in _MESSAGE_KEYS and v is not None)
        if unknown:
            problems.append(f"{at}: unknown keys {unknown}")
        content, calls = m.get("content"), m.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                problems.append(f"{at}: only assistant messages carry tool_calls (role is {role!r})")
            found, ids = _check_tool_calls(at, calls)
            problems += found
            call_ids.update(ids)
        if content is not None and not isinstance(content, str):
            problems.append(f"{at}: content must be text")
        elif (content is None or content == "") and role == "assistant" and not calls:
            problems.append(f"{at}: assistant message has neither content nor tool_calls")
        elif content is None and role != "assistant":
            problems.append(f"{at}: {role} message has no content")
        if role == "tool" and m.get("tool_call_id") not in call_ids:
            problems.append(
                f"{at}: tool message answers {m.get('tool_call_id')!r}, which no earlier assistant tool call has"
            )
        weight = m.get("weight")
        if weight is not None:
            if not weights:
                problems.append(f"{at}: weight is not allowed in this format")
            elif role != "assistant":
                problems.append(f"{at}: weight is allowed only on assistant messages")
            elif type(weight) is not int or weight not in (0, 1):
                problems.append(f"{at}: weight must be 0 or 1, got {weight!r}")
    return problems


def _check_tools(tools: Any, where: str = "") -> list[str]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        return [f"{where}tools must be a list"]
    problems: list[str] = []
    for i, raw in enumerate(cast(list[Any], tools)):
        tool = cast(dict[str, Any], raw) if isinstance(raw, dict) else {}
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, dict) or not cast(dict[str, Any], fn).get("name"):
            problems.append(f"{where}tool {i}: must be {{'type': 'function', 'function': {{'name': ...}}}}")
    return problems


def _check_size(tokens: int | None, max_tokens: int) -> list[str]:
    if tokens is not None and tokens > max_tokens:
        return [f"{tokens} tokens, over the {max_tokens}-token limit of one example (pass --max-tokens to change it)"]
    return []


def check_sft_openai(data: dict[str, Any], tokens: int | None, max_tokens: int = MAX_EXAMPLE_TOKENS) -> list[str]:
    """OpenAI chat fine-tuning: ``{"messages": [...], "tools"?: [...]}``."""
    unknown = sorted(set(data) - {"messages", "tools", "parallel_tool_calls"})
    problems = [f"unknown top-level keys {unknown}"] if unknown else []
    messages = data.get("messages")
    problems += check_messages(messages, weights=True)
    problems += _check_tools(data.get("tools"))
    if isinstance(messages, list):
        trained = [
            m
            for m in cast(list[Any], messages)
            if isinstance(m, dict) and m.get("role") == "assistant" and m.get("weight", 1) == 1
        ]
        if not trained:
            problems.append("no assistant message to train on (all have weight 0)")
    return problems + _check_size(tokens, max_tokens)


def _check_output(data: dict[str, Any], key: str) -> list[str]:
    out = data.get(key)
    if not isinstance(out, list) or len(cast(list[Any], out)) != 1:
        return [f"{key} must hold exactly one assistant message"]
    problems = check_messages(out, weights=False, where=f"{key} ")
    first = cast(list[Any], out)[0]
    if isinstance(first, dict) and cast(dict[str, Any], first).get("role") != "assistant":
        problems.append(f"{key} message 0: must be an assistant message")
    return problems


def check_preference_openai(
    data: dict[str, Any], tokens: int | None, max_tokens: int = MAX_EXAMPLE_TOKENS
) -> list[str]:
    """OpenAI preference fine-tuning: ``input`` (messages, tools), ``preferred_output``, ``non_preferred_output``."""
    problems: list[str] = []
    raw_input = data.get("input")
    if not isinstance(raw_input, dict):
        problems.append("input must be an object with messages")
    else:
        inp = cast(dict[str, Any], raw_input)
        problems += check_messages(inp.get("messages"), weights=False, where="input ")
        problems += _check_tools(inp.get("tools"), "input ")
    problems += _check_output(data, "preferred_output") + _check_output(data, "non_preferred_output")
    if data.get("preferred_output") == data.get("non_preferred_output"):
        problems.append("preferred and non-preferred outputs are identical")
    return problems + _check_size(tokens, max_tokens)


def check_sft_trl(data: dict[str, Any], tokens: int | None, max_tokens: int = MAX_EXAMPLE_TOKENS) -> list[str]:
    """TRL's conversational prompt-completion (``prompt``, ``completion``) or language-modeling (``messages``)."""
    problems: list[str] = []
    if "messages" in data:
        problems += check_messages(data["messages"], weights=False)
    else:
        problems += check_messages(data.get("prompt"), weights=False, where="prompt ")
        problems += _check_output(data, "completion")
    tools = data.get("tools")
    if tools is not None:
        try:
            problems += _check_tools(json.loads(tools) if isinstance(tools, str) else tools)
        except ValueError:
            problems.append("tools is not valid JSON")
    return problems + _check_size(tokens, max_tokens)


def check_preference_trl(data: dict[str, Any], tokens: int | None, max_tokens: int = MAX_EXAMPLE_TOKENS) -> list[str]:
    """TRL's conversational preference format: ``prompt``, ``chosen``, ``rejected``."""
    problems = check_messages(data.get("prompt"), weights=False, where="prompt ")
    problems += _check_output(data, "chosen") + _check_output(data, "rejected")
    if data.get("chosen") == data.get("rejected"):
        problems.append("chosen and rejected are identical")
    return problems + _check_size(tokens, max_tokens)
