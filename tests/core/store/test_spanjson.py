"""The fast span serialiser writes what pydantic's ``model_dump_json`` writes, value for value."""

from __future__ import annotations

import decimal
import math
from typing import Any

import pytest

from lightning_rl.store._spanjson import dump_span
from lightning_rl.types import Span, SpanEvent, SpanStatus


def _span(attributes: dict[str, Any], **kw: Any) -> Span:
    return Span(name="llm.call", rollout_id="r-1", attempt_id="a-1", attributes=attributes, **kw)


CASES: dict[str, dict[str, Any]] = {
    "token ids and logprobs": {
        "lightning.prompt_token_ids": list(range(300)),
        "lightning.response_logprobs": [-0.1234567890123, -1e-12, -33.5, 0.0],
        "text": 'héllo ✓ \n\t"quoted" \u2028',
    },
    "non-finite floats become null": {"x": [math.nan, math.inf, -math.inf, 1.5]},
    "integer dict keys become strings": {"m": {1: "a", 2: {"n": None}}},
    "nested and empty values": {"a": [], "b": {}, "c": [[1, [2.5, True]], {"d": False}], "e": None},
    "large but 64-bit integers": {"big": 2**63 - 1, "neg": -(2**63)},
    # Values orjson does not write take pydantic's path, so the result cannot differ:
    "beyond 64 bits": {"huge": 2**70},
    "a set": {"s": {3}},
    "a decimal": {"d": decimal.Decimal("1.10")},
    "bytes": {"b": b"raw"},
    "a tuple": {"t": (1, "x")},
}


@pytest.mark.parametrize("name", list(CASES))
def test_dump_span_matches_pydantic(name: str) -> None:
    span = _span(
        CASES[name],
        events=[SpanEvent(name="exception", time_ns=5, attributes={"k": [1.0, 2]})],
        status=SpanStatus(code="error", message="boom"),
        end_ns=10,
        parent_id="p",
    )
    expected = span.model_copy(update={"seq": 7}).model_dump_json()
    assert dump_span(span, 7) == expected
    back = Span.model_validate_json(dump_span(span, 7))
    assert back.seq == 7 and back == Span.model_validate_json(expected)


def test_dump_span_keeps_the_callers_span_unchanged() -> None:
    span = _span({"ids": [1, 2, 3]})
    dump_span(span, 42)
    assert span.seq == 0


async def test_memory_store_batch_is_all_or_nothing_when_cancelled() -> None:
    """``MemoryStore.add_spans`` yields to the loop inside big batches; cancelling it there changes nothing."""
    import asyncio

    from lightning_rl.store import MemoryStore
    from lightning_rl.types import RolloutRequest, Task

    store = MemoryStore()
    await store.enqueue([RolloutRequest(id="r-1", task=Task(input=0))])
    [claim] = await store.claim("w")
    spans = [
        Span(name="s", rollout_id="r-1", attempt_id=claim.attempt.id, attributes={"i": i, "ids": list(range(50))})
        for i in range(1000)
    ]
    task = asyncio.create_task(store.add_spans(spans))
    for _ in range(3):
        await asyncio.sleep(0)  # let it serialise a few slices, then cancel it mid-batch
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await store.query_spans(rollout_id="r-1") == []
    assert await store.add_spans(spans + spans[:3]) == 1000  # duplicates in a batch count once
    stored = await store.query_spans(rollout_id="r-1")
    assert [s.seq for s in stored] == list(range(1, 1001))
    assert [s.attributes["i"] for s in stored] == list(range(1000))
