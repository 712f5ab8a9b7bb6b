"""Shared setup of the capture tests: the real instrumentations on a "user's" tracer provider.

Each test gets a fresh SDK ``TracerProvider`` with its own in-memory exporter standing for the
user's exporter (it must keep receiving every span), turns capture on for it, and runs agents
inside real rollout attempts of a ``MemoryStore``; the spans the Lightning processor routed go
into that store and come back through ``query_spans``, as the trainer reads them.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENAI_API_KEY", "sk-test-not-used")  # the Agents SDK's default client wants one
os.environ.setdefault("LANGSMITH_TRACING", "false")
os.environ.setdefault("LANGCHAIN_TRACING_V2", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.pop("OPENAI_AGENTS_DISABLE_TRACING", None)

import re  # noqa: E402
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.instrumentation.openai")
pytest.importorskip("openinference.instrumentation.openai")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from lightning_rl.adapter import AdaptedAttempt, AIRPolicy, adapt_attempt  # noqa: E402
from lightning_rl.capture import Capture, Family, capture  # noqa: E402
from lightning_rl.store import MemoryStore  # noqa: E402
from lightning_rl.tracing import rollout_context  # noqa: E402
from lightning_rl.types import Claim, RolloutRequest, Span, Task, Transition  # noqa: E402

FAMILIES: list[Family] = ["openllmetry", "openinference"]


@dataclass
class Captured:
    """A capture turned on for one test: the user's provider and exporter, and a store."""

    capture: Capture
    exporter: InMemorySpanExporter
    store: MemoryStore = field(default_factory=MemoryStore)
    sink: list[Span] = field(default_factory=list[Span])

    async def run(self, agent: Callable[[], Awaitable[Any]], task_input: Any = None) -> tuple[Claim, Any]:
        """Run ``agent`` inside a fresh rollout attempt; its routed spans land in the store."""
        [rollout] = await self.store.enqueue([RolloutRequest(task=Task(input=task_input))])
        [claim] = await self.store.claim("capture-test")
        assert claim.rollout.id == rollout.id
        mine: list[Span] = []
        with rollout_context(claim.rollout.id, claim.attempt.id, sink=mine.append, task=claim.rollout.task):
            out = await agent()
        self.sink += mine
        if mine:
            await self.store.add_spans(mine)
        return claim, out

    async def spans(self, claim: Claim) -> list[Span]:
        return await self.store.query_spans(attempt_id=claim.attempt.id)

    async def adapt(self, claim: Claim, *, trainable: Any = "all", air: AIRPolicy | None = None) -> AdaptedAttempt:
        return adapt_attempt(claim.rollout, claim.attempt.id, await self.spans(claim), trainable=trainable, air=air)

    def exported(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()


@asynccontextmanager
async def captured(family: Family, frameworks: list[str] | None = None) -> AsyncIterator[Captured]:
    """Capture on a fresh "user" provider (with its own exporter) for the block; uninstrumented after."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    cap = capture(family, frameworks=frameworks or ["openai"], tracer_provider=provider)
    try:
        yield Captured(cap, exporter)
    finally:
        cap.close()
        provider.shutdown()


@pytest.fixture(autouse=True)
def _no_leftover_capture() -> Iterator[None]:
    """Instrumentors are process-global: a test that failed half-way must not leak one into the next."""
    from lightning_rl.capture import _install

    yield
    for leftover in list(_install._active.values()):  # pyright: ignore[reportPrivateUsage]
        leftover.close()


def anonymised(value: Any) -> Any:
    """``value`` with each tool-call id replaced by its order of first appearance.

    The fake upstream draws tool-call ids at random, so two runs of one conversation differ only
    in them; everything else must be equal.
    """
    seen: dict[str, str] = {}

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {
                k: (seen.setdefault(str(x), f"id{len(seen)}") if k in ("id", "tool_call_id") and x else walk(x))
                for k, x in v.items()  # pyright: ignore[reportUnknownVariableType]
            }
        if isinstance(v, list):
            return [walk(x) for x in v]  # pyright: ignore[reportUnknownVariableType]
        if isinstance(v, str):
            return re.sub(r"call_[0-9a-f]{12}", lambda m: seen.setdefault(m.group(0), f"id{len(seen)}"), v)
        return v

    return walk(value)


def text_view(transitions: list[Transition]) -> list[dict[str, Any]]:
    """What must be equal between the gateway's transitions and the captured ones: text and role."""
    out: list[dict[str, Any]] = []
    for t in transitions:
        assert t.text is not None, f"transition {t.span_id} carries no text"
        out.append(
            {
                "role": t.role,
                "messages": t.text.messages,
                "response": t.text.response,
                "tool_calls": t.text.tool_calls,
            }
        )
    return anonymised(out)
