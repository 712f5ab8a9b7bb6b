"""Parse tool calls out of generated text, without ever failing the request.

A model being trained makes formatting mistakes all the time: half-written JSON, a tag never closed
because ``max_tokens`` ran out. Those completions are still valid training samples (they earn low
rewards), so the parser never raises: a malformed call comes back as plain content with
``parse_error`` set, which the gateway records on the span and returns to the agent as text.

The syntax is the Qwen/Hermes one the tiny model's chat template teaches::

    optional text<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>

Whitespace (including newlines) around the JSON inside the tags is allowed, as real Qwen models emit it.
A block may also hold a JSON list of such objects, the form SmolLM2-Instruct was trained to emit
(``<tool_call>[{"name": "f", "arguments": {}}]</tool_call>``, see ``lightning_rl.engine.smollm2``);
an empty list means "no call".
"""

from __future__ import annotations

import json
import secrets
from typing import Any, cast

from lightning_rl.engine.base import ParsedMessage, ParsedToolCall

__all__ = ["TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "new_tool_call_id", "parse_tool_calls"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool-call id, ``call_`` followed by 24 hex digits."""
    return f"call_{secrets.token_hex(12)}"


def _parse_block(body: str) -> list[ParsedToolCall]:
    """The calls of the text between the tags (an object, or a list of objects); raises ``ValueError``
    saying what is wrong."""
    payload = json.loads(body)  # json.JSONDecodeError is a ValueError
    if isinstance(payload, list):
        return [_parse_one(item) for item in cast(list[Any], payload)]
    return [_parse_one(payload)]


def _parse_one(payload: Any) -> ParsedToolCall:
    """One call from its decoded JSON; raises ``ValueError`` saying what is wrong."""
    if not isinstance(payload, dict):
        raise ValueError(f"a tool call must be a JSON object, got {type(payload).__name__}")
    call = cast(dict[str, Any], payload)
    name = call.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError('a tool call needs a non-empty string "name"')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string
        arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        raise ValueError(f'"arguments" must be a JSON object, got {type(arguments).__name__}')
    return ParsedToolCall(id=new_tool_call_id(), name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def parse_tool_calls(text: str, open_tag: str = TOOL_CALL_OPEN, close_tag: str = TOOL_CALL_CLOSE) -> ParsedMessage:
    """Split generated ``text`` into assistant content and tool calls.

    Returns:
        ``content`` is the text outside the tool-call blocks (``None`` when only calls remain);
        ``arguments`` are re-serialised JSON (``json.dumps`` spacing, the same text the chat template
        renders back). If any block is malformed (invalid JSON, no ``name``, an unclosed tag), the
        whole text is returned as content with no calls and ``parse_error`` says what was wrong.
    """
    calls: list[ParsedToolCall] = []
    outside: list[str] = []
    position = 0
    while (start := text.find(open_tag, position)) != -1:
        outside.append(text[position:start])
        body_start = start + len(open_tag)
        end = text.find(close_tag, body_start)
        if end == -1:
            return ParsedMessage(content=text, tool_calls=[], parse_error=f"unclosed {open_tag} (no {close_tag})")
        try:
            calls.extend(_parse_block(text[body_start:end].strip()))
        except ValueError as exc:
            return ParsedMessage(content=text, tool_calls=[], parse_error=f"invalid tool call #{len(calls) + 1}: {exc}")
        position = end + len(close_tag)
    outside.append(text[position:])
    if not calls:
        if position == 0:  # no block at all
            return ParsedMessage(content=text, tool_calls=[])
        content = "".join(outside).strip()  # only empty lists: "no call", the text around them is the answer
        return ParsedMessage(content=content or None, tool_calls=[])
    content = "".join(outside).strip()
    return ParsedMessage(content=content or None, tool_calls=calls)
