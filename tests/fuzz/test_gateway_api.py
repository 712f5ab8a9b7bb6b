"""Schema-driven fuzzing of the gateway: chat, completions, responses, streaming, rollout URLs.

The gateway has no generated schema (its model-call routes bypass FastAPI), so the fuzzer reads the
hand-written OpenAPI document in ``gateway_openapi.py``. A real gateway over the tiny engine and a
real store answers every drawn request on 127.0.0.1: valid ones (with ``stream`` true or false) and,
in negative mode, ones that break the schema. None may end in a 5xx or take longer than the
documented limits, a 4xx must be in OpenAI's error shape, and afterwards the gateway must still
serve a plain call and a call inside a rollout (which it must record).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from lightning_rl.agent import rollout_base_url  # noqa: E402
from lightning_rl.engine.hf import TransformersEngine  # noqa: E402
from lightning_rl.engine.tiny import default_tiny_model  # noqa: E402
from lightning_rl.gateway import GatewayConfig, create_gateway_app, running_gateway  # noqa: E402
from lightning_rl.store import MemoryStore  # noqa: E402
from lightning_rl.types import RolloutRequest, Task  # noqa: E402

from .gateway_openapi import gateway_openapi  # noqa: E402
from .serving_helpers import BackgroundLoop, served_in_thread  # noqa: E402

pytestmark = pytest.mark.fuzz

EXAMPLES = 10
"""Examples per operation and mode (each valid call decodes at most 4 tokens x n of the tiny model)."""
REQUEST_TIMEOUT_S = 30.0
"""A call of at most 8 tokens on the tiny model answers in well under a second; 30 s is a hang."""

SCHEMA = schemathesis.openapi.from_dict(gateway_openapi())
OPERATIONS = [op.ok() for op in SCHEMA.get_all_operations()]


class _Gateway:
    """The gateway and its store, entered on the background loop."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self.store = MemoryStore()

    async def __aenter__(self) -> tuple[str, MemoryStore]:
        app = create_gateway_app(self.engine, store=self.store, config=GatewayConfig(max_n=4, max_tokens_limit=64))
        self.cm = running_gateway(app)
        return await self.cm.__aenter__(), self.store

    async def __aexit__(self, *exc: object) -> None:
        await self.cm.__aexit__(None, None, None)
        await self.store.close()


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, MemoryStore, BackgroundLoop]]:
    engine = TransformersEngine.from_pretrained(default_tiny_model(), max_batch_size=16)
    try:
        with served_in_thread(lambda: _Gateway(engine)) as ((url, store), loop):
            yield url, store, loop
    finally:
        engine.close()


def check_answer(case: Any, response: Any) -> None:
    """No 5xx; an error is OpenAI's ``{"error": {"message", "type", "param", "code"}}``."""
    case.validate_response(response, checks=[not_a_server_error])
    if 400 <= response.status_code < 500:
        error = response.json()["error"]
        assert error["message"] and {"type", "param", "code"} <= set(error), response.text
    elif response.status_code == 200 and "text/event-stream" in response.headers.get("content-type", ""):
        lines = [line for line in response.text.splitlines() if line.startswith("data:")]
        assert lines, "an empty event stream"
        if case.path.endswith("/responses"):
            assert '"response.completed"' in response.text or '"error"' in response.text, response.text[-500:]
        else:
            assert lines[-1].strip() == "data: [DONE]", lines[-1]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_no_server_error(
    operation: Any, mode: GenerationMode, gateway: tuple[str, MemoryStore, BackgroundLoop]
) -> None:
    url = gateway[0]
    if mode is GenerationMode.NEGATIVE and not len(operation.body):
        pytest.skip("no body to break")

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    def fuzz(case: Any) -> None:
        check_answer(case, case.call(base_url=url, timeout=REQUEST_TIMEOUT_S))

    fuzz()


def test_still_serves_after_fuzzing(gateway: tuple[str, MemoryStore, BackgroundLoop]) -> None:
    """A plain call answers, and a call inside a rollout is answered and recorded as an ``llm.call`` span."""
    url, store, loop = gateway
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    plain = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=30)
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["role"] == "assistant"

    async def claim() -> Any:
        await store.enqueue([RolloutRequest(id="after-fuzz", task=Task(input=1))])
        [c] = await store.claim("w")
        return c

    c = loop.run(claim())
    base = rollout_base_url(url, c.rollout.id, c.attempt.id, c.attempt.gateway_key)
    r = httpx.post(f"{base}/chat/completions", json=chat, timeout=30)
    assert r.status_code == 200, r.text

    async def recorded() -> list[str]:
        for _ in range(100):  # the gateway writes spans off the request path, in the background
            spans = await store.query_spans(attempt_id=c.attempt.id)
            if spans:
                return [s.name for s in spans]
            await asyncio.sleep(0.1)
        return []

    assert "llm.call" in loop.run(recorded())
