"""The one validation pass of each API: bad input answered the way the OpenAI API answers it.

Every field the gateway reads is checked here, once, straight on the parsed JSON, and the
handlers then read the body as it is. A refusal is a 400 with OpenAI's wording (``Invalid type
for 'messages[0].content': expected …``), ``param`` set to the offending path
(``messages[0].role``) and a ``code`` (``missing_required_parameter``, ``invalid_type``,
``invalid_value``), so a framework shows its user exactly what to fix. Types are strict, as
OpenAI's are: ``"5"`` and ``true`` are not integers. A request that passes is one the chat
template and the engine can take: no client input reaches them malformed, so none can end in a 500.

Unknown fields are still ignored (frameworks send many we do not use); only the shape of the
fields the gateway reads is enforced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

from lightning_rl.gateway.protocol import GatewayHTTPError

__all__ = ["check_chat_request", "check_completion_request", "check_responses_request", "ROLES"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The chat roles the OpenAI API accepts."""

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PART_TYPES = ("text", "image_url", "input_audio", "file", "refusal")
_TEXT_ONLY = "this model accepts text only; remove image, audio and file parts."
_MAX_STOP = 4
_MAX_LOGIT_BIAS = 300


_KINDS: tuple[tuple[type, str], ...] = (
    (type(None), "null"),
    (bool, "a boolean"),  # before int: a bool is an int to Python, not to JSON
    (int, "an integer"),
    (float, "a decimal"),
    (str, "a string"),
    (list, "an array"),
    (dict, "an object"),
)


def invalid_type(param: str, expected: str, value: Any) -> GatewayHTTPError:
    """OpenAI's answer to a field of the wrong JSON type (named as OpenAI names it: "an integer")."""
    kind = next((name for t, name in _KINDS if isinstance(value, t)), type(value).__name__)
    msg = f"Invalid type for '{param}': expected {expected}, but got {kind} instead."
    return GatewayHTTPError(400, msg, param=param, code="invalid_type")


def invalid_value(param: str, message: str) -> GatewayHTTPError:
    """OpenAI's answer to a field whose type is right and whose value is not."""
    return GatewayHTTPError(400, f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def missing_parameter(param: str) -> GatewayHTTPError:
    return GatewayHTTPError(
        400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _string(obj: dict[str, Any], key: str, param: str, *, required: bool = False) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise missing_parameter(param)
        return None
    if not isinstance(value, str):
        raise invalid_type(param, "a string", value)
    return value


def _objects(items: list[Any], param: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The items of an array of objects with their paths (``messages[0]``), refusing any other item."""
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid_type(f"{param}[{i}]", "an object", item)
        yield f"{param}[{i}]", item  # pyright: ignore[reportUnknownArgumentType]


# --- fields shared by the APIs ---
def _check_int(body: dict[str, Any], key: str, low: int | None = None, high: int | None = None) -> None:
    value = body.get(key)
    if value is None:
        return
    if not _is_int(value):
        raise invalid_type(key, "an integer", value)
    if low is not None and (value < low or (high is not None and value > high)):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise invalid_value(key, f"{value} is out of range; it must be {bound}.")


def _check_number(body: dict[str, Any], key: str, low: float, high: float) -> None:
    value = body.get(key)
    if value is None:
        return
    if not _is_number(value):
        raise invalid_type(key, "a number", value)
    if not low <= value <= high:
        raise invalid_value(key, f"{value} is out of range; it must be between {low:g} and {high:g}.")


def _check_bool(body: dict[str, Any], key: str, param: str | None = None) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid_type(param or key, "a boolean", value)


def _check_object(body: dict[str, Any], key: str) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise invalid_type(key, "an object", value)


def _check_stop(body: dict[str, Any]) -> None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list):
        raise invalid_type("stop", "a string or an array of strings", stop)
    if len(stop) > _MAX_STOP:
        raise invalid_value("stop", f"at most {_MAX_STOP} stop sequences are allowed, got {len(stop)}.")
    for i, item in enumerate(stop):
        if not isinstance(item, str):
            raise invalid_type(f"stop[{i}]", "a string", item)


def _check_logit_bias(body: dict[str, Any]) -> None:
    bias = body.get("logit_bias")
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise invalid_type("logit_bias", "an object mapping token ids to numbers", bias)
    if len(bias) > _MAX_LOGIT_BIAS:
        raise invalid_value("logit_bias", f"at most {_MAX_LOGIT_BIAS} tokens may be biased, got {len(bias)}.")
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise invalid_value("logit_bias", f"the key {key!r} is not a token id (a non-negative integer).")
        if not _is_number(value):
            raise invalid_type(f"logit_bias.{key}", "a number", value)
        if not -100 <= value <= 100:
            raise invalid_value(f"logit_bias.{key}", f"{value} is out of range; it must be between -100 and 100.")


def _check_ranges(body: dict[str, Any]) -> None:
    """The finer rules on sampling fields, checked after the shape of the whole body (which fault a
    body with several is answered about depends on this order; it is kept stable)."""
    top_p = body.get("top_p")
    if top_p is not None and top_p <= 0:
        raise invalid_value("top_p", f"{top_p} is out of range; it must be greater than 0 and at most 1.")
    if body.get("stream_options") is not None:
        _check_bool(body["stream_options"], "include_usage", "stream_options.include_usage")


def _check_sampling(body: dict[str, Any], *, max_tokens_keys: tuple[str, ...]) -> None:
    _check_int(body, "n", 1, 128)
    for key in max_tokens_keys:
        _check_int(body, key, 1)
    _check_number(body, "temperature", 0.0, 2.0)
    _check_number(body, "top_p", 0.0, 1.0)
    _check_number(body, "presence_penalty", -2.0, 2.0)
    _check_number(body, "frequency_penalty", -2.0, 2.0)
    _check_int(body, "seed")
    _check_bool(body, "stream")
    _check_object(body, "stream_options")
    _string(body, "model", "model")
    _check_stop(body)
    _check_logit_bias(body)


# --- chat completions ---
def _check_content(message: dict[str, Any], param: str, role: str) -> None:
    content = message.get("content")
    if content is None:
        if role in ("assistant", "function"):
            return  # an assistant turn that only calls tools has no content
        raise missing_parameter(param)
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise invalid_type(param, "one of a string or array of objects", content)
    for where, part in _objects(content, param):
        kind = part.get("type")
        if kind is None:
            raise missing_parameter(f"{where}.type")
        if kind not in _PART_TYPES:
            supported = ", ".join(f"'{t}'" for t in _PART_TYPES)
            raise invalid_value(f"{where}.type", f"'{kind}'. Supported values are: {supported}.")
        if kind not in ("text", "refusal"):
            raise invalid_value(f"{where}.type", f"'{kind}': {_TEXT_ONLY}")
        _string(part, kind, f"{where}.{kind}", required=True)


def _check_tool_calls(message: dict[str, Any], param: str) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise invalid_type(param, "an array", calls)
    for where, call in _objects(calls, param):
        _string(call, "id", f"{where}.id", required=True)
        fn = call.get("function")
        if fn is None:
            raise missing_parameter(f"{where}.function")
        if not isinstance(fn, dict):
            raise invalid_type(f"{where}.function", "an object", fn)
        _string(fn, "name", f"{where}.function.name", required=True)
        _string(fn, "arguments", f"{where}.function.arguments", required=True)


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if messages is None:
        raise missing_parameter("messages")
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array", messages)
    if not messages:
        raise invalid_value("messages", "the array is empty; send at least one message.")
    for param, message in _objects(messages, "messages"):
        role = message.get("role")
        if role is None:
            raise missing_parameter(f"{param}.role")
        if not isinstance(role, str):
            raise invalid_type(f"{param}.role", "a string", role)
        if role not in ROLES:
            supported = ", ".join(f"'{r}'" for r in ROLES)
            raise invalid_value(f"{param}.role", f"'{role}'. Supported values are: {supported}.")
        _check_content(message, f"{param}.content", role)
        _string(message, "name", f"{param}.name")
        if role == "tool":
            _string(message, "tool_call_id", f"{param}.tool_call_id", required=True)
        if role == "assistant":
            _check_tool_calls(message, f"{param}.tool_calls")


def _check_tools(body: dict[str, Any], *, responses: bool = False) -> list[str]:
    """The function tools' names (to check ``tool_choice`` against). Chat nests a tool's fields in
    ``function``; the Responses API has them flat, and other tool types (refused later, see
    ``_check_servable``)."""
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise invalid_type("tools", "an array", tools)
    names: list[str] = []
    for param, tool in _objects(tools, "tools"):
        kind = tool.get("type") if responses else tool.get("type", "function")
        if kind is None and responses:
            raise missing_parameter(f"{param}.type")
        if kind != "function":
            if responses:
                continue
            raise invalid_value(f"{param}.type", f"'{kind}'. Supported values are: 'function'.")
        fn, where = (tool, param) if responses else (tool.get("function"), f"{param}.function")
        if fn is None:
            raise missing_parameter(where)
        if not isinstance(fn, dict):
            raise invalid_type(where, "an object", fn)
        name = _string(fn, "name", f"{where}.name", required=True) or ""
        if not responses and not _TOOL_NAME.match(name):
            raise invalid_value(
                f"{where}.name",
                f"{name!r} does not match '^[a-zA-Z0-9_-]{{1,64}}$' (letters, digits, '_' and '-', at most 64).",
            )
        if not responses:
            _string(fn, "description", f"{where}.description")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise invalid_type(f"{where}.parameters", "an object", fn["parameters"])
        names.append(name)
    return names


def _check_tool_choice(body: dict[str, Any], names: list[str], *, responses: bool = False) -> None:
    choice = body.get("tool_choice")
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise invalid_value("tool_choice", f"'{choice}'. Supported values are: 'none', 'auto' and 'required'.")
        if choice == "required" and not names:
            raise invalid_value("tool_choice", "'required' is only allowed when 'tools' are specified.")
        return
    if not isinstance(choice, dict):
        raise invalid_type("tool_choice", "one of a string or an object", choice)
    if choice.get("type") != "function":
        raise invalid_value("tool_choice.type", f"'{choice.get('type')}'. Supported values are: 'function'.")
    if responses:
        name = _string(choice, "name", "tool_choice.name", required=True)
    else:
        fn = choice.get("function")
        if fn is None:
            raise missing_parameter("tool_choice.function")
        if not isinstance(fn, dict):
            raise invalid_type("tool_choice.function", "an object", fn)
        name = _string(fn, "name", "tool_choice.function.name", required=True)
    if name not in names:
        raise invalid_value("tool_choice", f"the function {name!r} is not among 'tools'.")


def check_chat_request(body: dict[str, Any]) -> None:
    """Raise ``GatewayHTTPError`` (400, ``param`` set) for a chat completions body OpenAI would refuse."""
    _check_messages(body)
    _check_sampling(body, max_tokens_keys=("max_tokens", "max_completion_tokens"))
    _check_tool_choice(body, _check_tools(body))
    _check_bool(body, "logprobs")
    _check_int(body, "top_logprobs", 0, 20)
    _check_bool(body, "parallel_tool_calls")
    _check_object(body, "response_format")
    fmt = body.get("response_format")
    if isinstance(fmt, dict):
        kind = fmt.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise invalid_value(
                "response_format.type", f"'{kind}'. Supported values are: 'text', 'json_object' and 'json_schema'."
            )
    _check_ranges(body)


# --- completions ---
def _check_token_ids(ids: list[Any], param: str) -> None:
    if not ids:
        raise invalid_value(param, "a token-id prompt is empty; send at least one token id.")
    for i, token in enumerate(ids):
        if not _is_int(token) or token < 0:
            raise invalid_type(f"{param}[{i}]", "a non-negative integer (a token id)", token)


def _text_or_array(body: dict[str, Any], key: str, expected: str) -> list[Any] | None:
    """The required ``body[key]`` when it is an array, ``None`` when it is a string."""
    value = body.get(key)
    if value is None:
        raise missing_parameter(key)
    if isinstance(value, str):
        return None
    if not isinstance(value, list):
        raise invalid_type(key, expected, value)
    return value  # pyright: ignore[reportUnknownVariableType]


def _check_prompt(body: dict[str, Any]) -> None:
    """``prompt``: a string, an array of token ids, or an array of strings or of token-id arrays."""
    prompt = _text_or_array(body, "prompt", "a string or an array")
    if prompt is None:
        return
    if not prompt:
        raise invalid_value("prompt", "the array is empty; send text or token ids.")
    first = prompt[0]
    if _is_int(first):
        _check_token_ids(prompt, "prompt")
    elif isinstance(first, str):
        for i, item in enumerate(prompt):
            if not isinstance(item, str):
                raise invalid_type(f"prompt[{i}]", "a string", item)
    elif isinstance(first, list):
        for i, item in enumerate(prompt):
            if not isinstance(item, list):
                raise invalid_type(f"prompt[{i}]", "an array of token ids", item)
            _check_token_ids(item, f"prompt[{i}]")
    else:
        raise invalid_type("prompt[0]", "a string, a token id or an array of token ids", first)
    if body.get("stream") is True and not _is_int(first) and len(prompt) > 1:
        raise invalid_value("prompt", "streaming accepts a single prompt; send one request per prompt.")


def check_completion_request(body: dict[str, Any]) -> None:
    """Raise ``GatewayHTTPError`` (400, ``param`` set) for a completions body OpenAI would refuse."""
    if body.get("prompt") is None:
        raise missing_parameter("prompt")
    _check_sampling(body, max_tokens_keys=("max_tokens",))
    _check_int(body, "logprobs")  # its range once the prompt is checked
    _check_bool(body, "echo")
    _check_ranges(body)
    _check_prompt(body)
    _check_int(body, "logprobs", 0, 20)


# --- responses ---
def _check_input(body: dict[str, Any]) -> None:
    items = _text_or_array(body, "input", "one of a string or array of input items")
    for param, item in _objects(items or [], "input"):
        kind = item.get("type") or "message"
        if kind == "message":
            role = item.get("role")
            if role is None:
                raise missing_parameter(f"{param}.role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid_value(
                    f"{param}.role", f"'{role}'. Supported values are: 'user', 'assistant', 'system' and 'developer'."
                )
            content = item.get("content")
            if content is None:
                raise missing_parameter(f"{param}.content")
            if not isinstance(content, str | list):
                raise invalid_type(f"{param}.content", "one of a string or array of objects", content)
            if isinstance(content, list):
                list(_objects(content, f"{param}.content"))  # every part an object
        elif kind == "function_call":
            _string(item, "call_id", f"{param}.call_id", required=True)
            _string(item, "name", f"{param}.name", required=True)
            _string(item, "arguments", f"{param}.arguments", required=True)
        elif kind == "function_call_output":
            _string(item, "call_id", f"{param}.call_id", required=True)
            if item.get("output") is None:
                raise missing_parameter(f"{param}.output")


def check_responses_request(body: dict[str, Any]) -> None:
    """Raise ``GatewayHTTPError`` for a Responses API body OpenAI would refuse.

    ``previous_response_id``: this gateway keeps no conversation state, so no id is known; OpenAI
    answers an unknown one with this 400 (send the whole conversation in ``input`` instead).
    """
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise invalid_type("previous_response_id", "a string", previous)
        raise GatewayHTTPError(
            400,
            f"Previous response with id '{previous}' not found. This gateway stores no responses; "
            "send the whole conversation in 'input' (store=false).",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    _check_input(body)
    _string(body, "instructions", "instructions")
    _check_sampling(body, max_tokens_keys=("max_output_tokens",))
    _check_tool_choice(body, _check_tools(body, responses=True), responses=True)
    _check_int(body, "top_logprobs", 0, 20)
    _check_bool(body, "parallel_tool_calls")
    _check_object(body, "metadata")
    _check_ranges(body)
    _check_servable(body)


_ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning", "item_reference")


def _check_servable(body: dict[str, Any]) -> None:
    """What a well-formed Responses body may still ask and this gateway cannot serve: input items
    of other types, image and file parts, tools other than functions."""
    items = body["input"]
    for i, item in enumerate(items if isinstance(items, list) else []):
        kind = item.get("type") or "message"
        if kind not in _ITEM_TYPES:
            supported = ", ".join(f"'{t}'" for t in _ITEM_TYPES)
            raise invalid_value(f"input[{i}].type", f"{kind!r}. Supported values are: {supported}.")
        content = item.get("content") if kind == "message" else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            if part.get("type") in ("input_image", "input_file", "image_url"):
                raise invalid_value(f"input[{i}].content[{j}].type", f"'{part['type']}': {_TEXT_ONLY}")
    for i, tool in enumerate(body.get("tools") or []):
        if tool["type"] != "function":
            raise invalid_value(f"tools[{i}].type", f"{tool['type']!r}: only function tools are supported here.")
