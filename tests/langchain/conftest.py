"""Shared setup for the LangChain plugin tests: telemetry off, and a clean instrumentor per test."""

from __future__ import annotations

import os
import uuid

os.environ.setdefault("LANGSMITH_TRACING", "false")
os.environ.setdefault("LANGCHAIN_TRACING_V2", "false")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")

from collections.abc import AsyncIterator, Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from lightning_langchain import LangChainInstrumentor  # noqa: E402


@pytest.fixture(autouse=True)
def _uninstrumented_after() -> Iterator[None]:
    """Every test starts and ends with the plugin uninstrumented (it is process-global state)."""
    LangChainInstrumentor().uninstrument()
    yield
    LangChainInstrumentor().uninstrument()


ModelFactory = Callable[..., Any]


@pytest.fixture
async def make_model() -> AsyncIterator[ModelFactory]:
    """Builds ``ChatOpenAI`` models the way users do, pointed at an unreachable URL (only routing
    can get their calls to the gateway); closes their clients afterwards.

    Each test gets its own base URL: langchain-openai caches its default httpx clients per base
    URL, and an async client's connection pool must not outlive the test's event loop.
    """
    from langchain.chat_models import init_chat_model
    from langchain_openai import ChatOpenAI

    built: list[Any] = []
    base_url = f"http://127.0.0.1:9/{uuid.uuid4().hex}/v1"  # nothing listens on port 9

    def make(*, via_init: bool = False, **kwargs: Any) -> Any:
        options: dict[str, Any] = {"max_retries": 0, "base_url": base_url, "api_key": "sk-user", **kwargs}
        name = str(options.pop("model", "gpt-4o-mini"))
        model: Any = init_chat_model(f"openai:{name}", **options) if via_init else ChatOpenAI(model=name, **options)
        built.append(model)
        return model

    yield make
    for model in built:
        model.root_client.close()
        await model.root_async_client.close()
