"""Fixtures for the OpenAI Agents SDK plugin tests: telemetry off, and the plugin on for one test.

The SDK's own trace exporter would try to upload to the vendor's backend (unreachable here); the
plugin removes it while instrumented, and ``OPENAI_AGENTS_DISABLE_TRACING`` must stay unset since
the plugin reads the SDK's spans.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENAI_API_KEY", "sk-test-not-used")  # the SDK's default client refuses to start without one
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("LANGSMITH_TRACING", "false")
os.environ.pop("OPENAI_AGENTS_DISABLE_TRACING", None)

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

pytest.importorskip("agents")

from lightning_openai_agents import OpenAIAgentsInstrumentor  # noqa: E402


@pytest.fixture
def plugin() -> Iterator[OpenAIAgentsInstrumentor]:
    """The plugin, instrumented with no trainable selection; uninstrumented afterwards."""
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.uninstrument()
    instrumentor.instrument()
    yield instrumentor
    instrumentor.uninstrument()
