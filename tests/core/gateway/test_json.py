"""The gateway's JSON helpers: orjson's fast path and pydantic-core's fallback give one behaviour."""

from __future__ import annotations

import json
import math

import pytest

from lightning_rl.gateway.protocol import dumpb, dumps, loads


def test_dumpb_writes_compact_utf8_json_with_exact_floats() -> None:
    obj = {"ids": list(range(5)), "lp": [-0.1234567890123456, -1e-300, 0.0], "t": 'héllo ✓ "q"\n', "n": None}
    out = dumpb(obj)
    assert out == json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    assert loads(out) == obj
    assert dumps(obj) == out.decode()


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"x": [math.nan, math.inf, -math.inf]}, b'{"x":[null,null,null]}'),  # strict JSON on both paths
        ({"big": 2**70, "x": math.inf}, b'{"big":1180591620717411303424,"x":null}'),  # fallback path
        ({1: "a"}, b'{"1":"a"}'),  # non-string keys: fallback path
        ({"s": (1, 2)}, b'{"s":[1,2]}'),
    ],
)
def test_dumpb_values_orjson_does_not_take(obj: object, expected: bytes) -> None:
    assert dumpb(obj) == expected


def test_loads_accepts_what_json_loads_accepts() -> None:
    assert loads(b'{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    assert loads('{"a": "\u00e9"}') == {"a": "é"}
    assert loads(b'{"seed": 18446744073709551615}') == {"seed": 2**64 - 1}  # 64 bits: exact
    assert loads(b'{"seed": 123456789012345678901234567890}') == {"seed": 1.2345678901234568e29}  # beyond
    lenient = loads(b'{"x": NaN, "y": -Infinity}')
    assert math.isnan(lenient["x"]) and lenient["y"] == -math.inf


@pytest.mark.parametrize("bad", [b"{bad", b"", b'{"a": 1', b"[1,]x"])
def test_loads_raises_value_error_on_broken_json(bad: bytes) -> None:
    with pytest.raises(ValueError):
        loads(bad)


def test_recorded_spans_equal_what_pydantic_would_construct() -> None:
    """The gateway builds spans without pydantic's per-field machinery; the result must not differ."""
    from lightning_rl.gateway.recording import CallContext, CallInfo, build_llm_spans
    from lightning_rl.gateway.upstreams import CallResult, ChoiceResult
    from lightning_rl.types import Span

    result = CallResult(
        [1, 2, 3], [ChoiceResult(0, "hi", "hi", "stop", token_ids=[7, 8], logprobs=[-0.5, -0.25])], True
    )
    info = CallInfo("chat.completions", "chat", "m", "m", "chatcmpl-" + "ab" * 16, False, 1, 2, 1.0, 1.0, 4, [])
    [span] = build_llm_spans(CallContext("r-1", "a-1", "writer"), "a-1", info, result)
    fields = {name: getattr(span, name) for name in Span.model_fields}
    reference = Span.model_construct(**fields)
    assert span == reference
    assert span.model_fields_set == reference.model_fields_set
    assert span.model_dump_json() == reference.model_dump_json()
    assert Span.model_validate_json(span.model_dump_json()) == span  # and it is a valid span
    assert span.status.code == "ok" and span.seq == 0 and span.attributes["lightning.role"] == "writer"
    status = span.status  # built the same way
    reference_status = type(status).model_construct(code="ok", message=None)
    assert status == reference_status and status.model_fields_set == reference_status.model_fields_set
