"""The serving fast path subclasses uvicorn's private classes only for tested uvicorn versions.

Issue 26.9: ``_serving.py`` relied on ``_start_asgi_task`` and friends, absent from uvicorn 0.30
and 0.35, while ``uvicorn>=0.30`` was allowed and nothing checked the installed version. Both
paths are tested here: the fast path on the installed (tested) uvicorn, and uvicorn's stock
protocol, forced by ``LIGHTNING_STOCK_UVICORN=1`` or chosen (with a warning) for another version.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lightning_rl import _serving
from lightning_rl.gateway import UpstreamBackend, create_gateway_app, running_gateway
from lightning_rl.testing import FakeUpstream

GOOD_CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@asynccontextmanager
async def serving() -> AsyncIterator[str]:
    """The real gateway in front of the scripted fake upstream (no model: this file also runs in
    ``.ci/uvicorn_lowest``'s environment, which has no torch)."""
    fake = FakeUpstream(responder=lambda body: "ok")
    async with running_gateway(fake.app) as up:
        async with running_gateway(create_gateway_app(UpstreamBackend(f"{up}/v1"))) as root:
            yield root


async def _exercise(root: str) -> None:
    """A call, a stream, an error and an ordinary route, on one keep-alive connection."""
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{root}/v1/chat/completions", json=GOOD_CHAT)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
        async with http.stream("POST", f"{root}/v1/chat/completions", json={**GOOD_CHAT, "stream": True}) as s:
            lines = [line async for line in s.aiter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]"
        r = await http.post(f"{root}/v1/chat/completions", json={"messages": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert (await http.get(f"{root}/health")).json()["status"] == "ok"


@pytest.mark.skipif(bool(os.environ.get("LIGHTNING_UVICORN_LOWEST")), reason="the lowest-version job")
def test_installed_uvicorn_is_in_the_tested_range() -> None:
    """CI runs this with the locked uvicorn: the fast path must be the one in use there."""
    assert _serving.fast_path_refusal() is None, uvicorn.__version__
    protocol = _serving.http_protocol()
    assert issubclass(protocol, HttpToolsProtocol) and protocol is not HttpToolsProtocol


async def test_fast_path_serves() -> None:
    async with serving() as root:
        await _exercise(root)


async def test_forced_stock_protocol_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_serving.STOCK_UVICORN_ENV, "1")
    assert _serving.http_protocol() is HttpToolsProtocol
    async with serving() as root:
        await _exercise(root)


async def test_untested_uvicorn_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn, "__version__", "0.30.6")
    monkeypatch.setattr(_serving, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"uvicorn 0\.30\.6 is outside the tested range"):
        assert _serving.http_protocol() is HttpToolsProtocol
    async with serving() as root:  # warned once per process: no second warning here
        await _exercise(root)
