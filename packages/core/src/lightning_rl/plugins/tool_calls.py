"""The tool calls a model asked for, read from OpenAI-format output, whatever object holds it.

Frameworks built on the OpenAI API keep the model's output as the SDK's pydantic objects or as
plain dicts, as chat messages (``tool_calls``), Responses-API items (``type == "function_call"``)
or whole responses (their ``output``). A plugin that sees the output but not the tool-call id of a
later tool run (the OpenAI Agents SDK's function spans carry none) reads the calls here and pairs
each run with the call of the same name and arguments (:func:`same_arguments`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ToolCallRef", "tool_calls_in", "same_arguments"]


@dataclass(frozen=True)
class ToolCallRef:
    """A tool call the model requested: its id, tool name and JSON arguments."""

    call_id: str
    name: str
    arguments: str | None


def same_arguments(a: str | None, b: str | None) -> bool:
    """Whether two JSON argument strings say the same thing (key order and spacing aside)."""
    if a is None or b is None:
        return True  # unknown on one side: the name alone decides
    try:
        return json.loads(a) == json.loads(b)
    except (TypeError, ValueError):
        return str(a).strip() == str(b).strip()


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` or ``obj[name]``: model output comes as pydantic objects or dicts."""
    if isinstance(obj, Mapping):
        return obj.get(name)  # pyright: ignore[reportUnknownMemberType]
    return getattr(obj, name, None)


def tool_calls_in(items: Iterable[Any] | None) -> list[ToolCallRef]:
    """Tool calls in model output: chat messages (``tool_calls``), responses-API items
    (``type == "function_call"``) or whole responses (their ``output``), as pydantic objects or dicts.

    A streamed chat-completions generation records the SDK's assembled ``Response`` here, a plain
    one the assistant message; both forms are read.
    """
    found: list[ToolCallRef] = []
    for item in items or ():
        nested = _field(item, "output")
        if isinstance(nested, list | tuple):
            found.extend(tool_calls_in(nested))  # pyright: ignore[reportUnknownArgumentType]
            continue
        if _field(item, "type") == "function_call":
            call_id, name = _field(item, "call_id"), _field(item, "name")
            if call_id and name:
                found.append(ToolCallRef(str(call_id), str(name), _field(item, "arguments")))
            continue
        for call in _field(item, "tool_calls") or ():
            function = _field(call, "function")
            call_id, name = _field(call, "id"), _field(function, "name")
            if call_id and name:
                found.append(ToolCallRef(str(call_id), str(name), _field(function, "arguments")))
    return found
