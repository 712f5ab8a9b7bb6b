"""A rollout whose ``llm.call`` span no Lightning gateway recorded still has a page (issue 45).

Found by tests/fuzz/test_dashboard_api.py: such a span (an OTLP exporter naming its spans
``llm.call``, with no token ids) made the adapter raise inside the credit view, and
``GET /api/rollouts/{id}`` answered 500. Now the page shows the rollout and its spans, and the
credit section's note says why it has no rows.
"""

from __future__ import annotations

from lightning_rl.dashboard._settings import load_credit_settings
from lightning_rl.dashboard.views import rollout_detail
from lightning_rl.store import MemoryStore
from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task


async def test_rollout_detail_explains_instead_of_failing() -> None:
    store = MemoryStore()
    await store.enqueue([RolloutRequest(id="r", task=Task(input=1))])
    [claim] = await store.claim("w")
    span = Span(name="llm.call", rollout_id="r", attempt_id=claim.attempt.id, attributes={"lightning.role": "x"})
    await store.add_spans([span])
    await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
    detail = await rollout_detail(store, "r", load_credit_settings(None))
    assert detail["rollout"]["id"] == "r" and detail["reward"] == 1.0
    assert [s["span_id"] for a in detail["attempts"] for s in a["spans"]] == [span.span_id]
    assert detail["credit"]["rows"] == [] and "token id" in detail["credit"]["note"]
