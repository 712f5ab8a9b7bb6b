"""Shared pieces of the gateway reliability tests: a real gateway over the tiny engine, error checks.

Not a conftest (other reliability tests have their own fixtures): the gateway tests import these.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.gateway import GatewayConfig, create_gateway_app, running_gateway
from lightning_rl.store import LightningStore

__all__ = ["serving", "assert_openai_error", "GOOD_CHAT"]

GOOD_CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@asynccontextmanager
async def serving(
    engine: TransformersEngine,
    store: LightningStore | None = None,
    *,
    config: GatewayConfig | None = None,
    **options: Any,
) -> AsyncIterator[str]:
    """A real gateway over ``engine`` on 127.0.0.1; yields its root URL."""
    app = create_gateway_app(
        engine, store=store, config=config or GatewayConfig(max_n=4, max_tokens_limit=64), **options
    )
    async with running_gateway(app) as url:
        yield url


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    """``r`` is an OpenAI-style error with ``status`` (and ``param``, when given)."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert error["message"], error
    if param is not None:
        assert error["param"] == param, error
    return error
