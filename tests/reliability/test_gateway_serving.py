"""The serving fast path subclasses uvicorn's private classes only for tested uvicorn versions.

Issue 26.9: ``_serving.py`` relied on ``_start_asgi_task`` and friends, absent from uvicorn 0.30
and 0.35, while ``uvicorn>=0.30`` was allowed and nothing checked the installed version. Both
paths are tested here: the fast path on the installed (tested) uvicorn, and uvicorn's stock
protocol, forced by ``LIGHTNING_STOCK_UVICORN=1`` or chosen (with a warning) for another version.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lightning_rl import _serving
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.tiny import default_tiny_model

from .gateway_helpers import GOOD_CHAT, assert_openai_error, serving


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    eng = TransformersEngine.from_pretrained(default_tiny_model(), max_batch_size=8)
    yield eng
    eng.close()


async def _exercise(root: str) -> None:
    """A call, a stream, an error and an ordinary route, on one keep-alive connection."""
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{root}/v1/chat/completions", json=GOOD_CHAT)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"
        async with http.stream("POST", f"{root}/v1/chat/completions", json={**GOOD_CHAT, "stream": True}) as s:
            lines = [line async for line in s.aiter_lines() if line.startswith("data:")]
        assert lines[-1] == "data: [DONE]"
        assert_openai_error(await http.post(f"{root}/v1/chat/completions", json={"messages": 5}), 400, "messages")
        assert (await http.get(f"{root}/health")).json()["status"] == "ok"


def test_installed_uvicorn_is_in_the_tested_range() -> None:
    """CI runs this with the locked uvicorn: the fast path must be the one in use there."""
    assert _serving.fast_path_refusal() is None, uvicorn.__version__
    protocol = _serving.http_protocol()
    assert issubclass(protocol, HttpToolsProtocol) and protocol is not HttpToolsProtocol


async def test_fast_path_serves(engine: TransformersEngine) -> None:
    async with serving(engine) as root:
        await _exercise(root)


async def test_forced_stock_protocol_serves(engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_serving.STOCK_UVICORN_ENV, "1")
    assert _serving.http_protocol() is HttpToolsProtocol
    async with serving(engine) as root:
        await _exercise(root)


async def test_untested_uvicorn_falls_back_with_a_warning(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uvicorn, "__version__", "0.30.6")
    monkeypatch.setattr(_serving, "_warned", set())
    with pytest.warns(RuntimeWarning, match=r"uvicorn 0\.30\.6 is outside the tested range"):
        assert _serving.http_protocol() is HttpToolsProtocol
    async with serving(engine) as root:  # warned once per process: no second warning here
        await _exercise(root)
