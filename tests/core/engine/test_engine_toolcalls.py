"""The tool-call parser never raises: malformed calls come back as flagged content."""

from __future__ import annotations

import json
import re

from lightning_rl.engine.toolcalls import new_tool_call_id, parse_tool_calls

ID = re.compile(r"^call_[0-9a-f]{24}$")


def test_plain_text_has_no_calls() -> None:
    parsed = parse_tool_calls("The answer is 42.")
    assert parsed.content == "The answer is 42." and parsed.tool_calls == [] and parsed.parse_error is None


def test_one_call() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>')
    assert parsed.content is None and parsed.parse_error is None
    (call,) = parsed.tool_calls
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "6 * 7"}
    assert ID.match(call.id)


def test_multiple_calls_with_text_and_whitespace() -> None:
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "search", "arguments": {"query": "weather", "limit": 3}}\n</tool_call>\n'
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.parse_error is None
    assert parsed.content == "Let me check."
    assert [c.name for c in parsed.tool_calls] == ["search", "calculator"]
    assert json.loads(parsed.tool_calls[0].arguments) == {"query": "weather", "limit": 3}
    assert json.loads(parsed.tool_calls[1].arguments) == {"expression": "1+1"}  # string arguments decoded
    assert len({c.id for c in parsed.tool_calls}) == 2


def test_missing_arguments_default_to_empty_object() -> None:
    (call,) = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>').tool_calls
    assert call.arguments == "{}"


def test_non_ascii_arguments_are_kept_readable() -> None:
    (call,) = parse_tool_calls('<tool_call>{"name": "search", "arguments": {"query": "café"}}</tool_call>').tool_calls
    assert call.arguments == '{"query": "café"}'


def test_invalid_json_is_content_with_parse_error() -> None:
    text = 'ok <tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.content == text and parsed.tool_calls == []
    assert parsed.parse_error is not None and "invalid tool call #1" in parsed.parse_error


def test_one_bad_call_among_good_ones_flags_the_whole_message() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>[1, 2]</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.tool_calls == [] and parsed.content == text
    assert parsed.parse_error is not None and "#2" in parsed.parse_error and "JSON object" in parsed.parse_error


def test_unclosed_tag() -> None:
    text = 'Sure. <tool_call>{"name": "calculator", "arguments": {"expression": "1"}}'
    parsed = parse_tool_calls(text)
    assert parsed.content == text and parsed.tool_calls == []
    assert parsed.parse_error is not None and "unclosed" in parsed.parse_error


def test_missing_name_and_bad_arguments() -> None:
    assert "name" in (parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>').parse_error or "")
    assert "arguments" in (parse_tool_calls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>').parse_error or "")


def test_ids_are_fresh() -> None:
    ids = {new_tool_call_id() for _ in range(100)}
    assert len(ids) == 100 and all(ID.match(i) for i in ids)


def test_a_json_list_of_calls_in_one_block() -> None:
    """SmolLM2-Instruct's trained form: one block, a list of calls; ``[]`` means no call."""
    text = '<tool_call>[\n{"name": "a", "arguments": {"x": 1}},\n{"name": "b", "arguments": {}}\n]</tool_call>'
    parsed = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("a", '{"x": 1}'), ("b", "{}")]
    assert parsed.content is None and parsed.parse_error is None
    empty = parse_tool_calls("The answer is 7. <tool_call>[]</tool_call>")
    assert empty.tool_calls == [] and empty.content == "The answer is 7." and empty.parse_error is None
    bad = parse_tool_calls('<tool_call>[{"name": "a"}, 3]</tool_call>')
    assert bad.tool_calls == [] and "JSON object" in (bad.parse_error or "")
