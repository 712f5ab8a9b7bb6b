"""Schema-driven fuzzing of the dashboard's JSON API (schemathesis over FastAPI's own schema).

The dashboard is a FastAPI app; it serves no schema (``openapi_url=None``: a production dashboard
need not advertise one), but ``app.openapi()`` still generates it from the routes, so the fuzzer
reads exactly what FastAPI validates. A real dashboard on 127.0.0.1 over a real SQLite store with
rollouts of every status, spans and a run folder's metrics answers valid and invalid queries
(filters, paging, rollout ids); none may end in a 5xx, and afterwards it still pages and shows a rollout.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from lightning_rl.dashboard._settings import load_credit_settings  # noqa: E402
from lightning_rl.dashboard.app import DashboardState, create_dashboard_app  # noqa: E402
from lightning_rl.dashboard.serve import running_dashboard  # noqa: E402
from lightning_rl.store import MemoryStore  # noqa: E402
from lightning_rl.store.sqlite import SQLiteStore  # noqa: E402
from lightning_rl.types import AttemptStatus, RolloutRequest, Span, Task  # noqa: E402

from .serving_helpers import served_in_thread  # noqa: E402

pytestmark = pytest.mark.fuzz

EXAMPLES = 25


def _schema() -> dict[str, Any]:
    state = DashboardState(store=MemoryStore(), store_label="memory", settings=load_credit_settings(None), run_dir=None)
    return create_dashboard_app(state).openapi()


SCHEMA = schemathesis.openapi.from_dict(_schema())
OPERATIONS = [op.ok() for op in SCHEMA.get_all_operations()]


async def _fill(db: Path) -> None:
    """Rollouts that ended every way, with spans (an LLM call, a reward), and two queued."""
    store = SQLiteStore(db)
    try:
        await store.enqueue([RolloutRequest(id=f"r{i}", task=Task(input={"q": i})) for i in range(6)])
        claims = await store.claim("w", n=4)
        for i, (c, status) in enumerate(
            zip(claims, [AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.TIMED_OUT], strict=False)
        ):
            attrs = {
                "lightning.role": "solver",
                "gen_ai.input.messages": json.dumps([{"role": "user", "content": "q"}]),
            }
            await store.add_spans(
                [Span(name="llm.call", rollout_id=c.rollout.id, attempt_id=c.attempt.id, attributes=attrs)]
            )
            await store.finish_attempt(
                c.attempt.id, status, reward=float(i) if status is AttemptStatus.SUCCEEDED else None
            )
    finally:
        await store.close()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    run = tmp_path_factory.mktemp("fuzz-dashboard")
    asyncio.run(_fill(run / "store.sqlite"))
    rows = [{"step": s, "train/reward_mean": s / 10, "val/reward_mean": None} for s in range(1, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with served_in_thread(lambda: running_dashboard(str(run / "store.sqlite"), run_dir=run, poll_s=60)) as (url, _):
        yield url


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_no_server_error(operation: Any, mode: GenerationMode, dashboard: str) -> None:
    if mode is GenerationMode.NEGATIVE and not len(operation.query):
        pytest.skip("no query to break: the only input is a path segment, and any string is a valid id")

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    def fuzz(case: Any) -> None:
        response = case.call(base_url=dashboard, timeout=15)
        case.validate_response(response, checks=[not_a_server_error])

    fuzz()


def test_still_serves_after_fuzzing(dashboard: str) -> None:
    page = httpx.get(f"{dashboard}/api/rollouts", params={"limit": 2, "offset": 0}, timeout=15)
    assert page.status_code == 200, page.text
    detail = httpx.get(f"{dashboard}/api/rollouts/r0", timeout=15)
    assert detail.status_code == 200 and "r0" in detail.text
    assert httpx.get(f"{dashboard}/api/rollouts/no-such-rollout", timeout=15).status_code == 404
