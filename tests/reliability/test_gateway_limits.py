"""Size and cost limits are enforced before work: one large request cannot stall the gateway.

Issue 26.4: a 70 MB body was read whole and answered 400 (not 413); a 10 MB prompt was tokenised on
the event loop, delaying a concurrent 4-token request by 10.6 s and ``/health`` by 5.2 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.tiny import default_tiny_model
from lightning_rl.gateway import GatewayConfig

from .gateway_helpers import GOOD_CHAT, assert_openai_error, serving

LIMIT = 256 * 1024
CONFIG = GatewayConfig(max_n=4, max_tokens_limit=64, max_body_bytes=LIMIT)


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    eng = TransformersEngine.from_pretrained(default_tiny_model(), max_batch_size=8)
    yield eng
    eng.close()


@pytest.fixture
async def url(engine: TransformersEngine) -> AsyncIterator[str]:
    async with serving(engine, config=CONFIG) as root:
        yield root


def _prompt(chars: int) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "weather " * (chars // 8)}], "max_tokens": 2}


async def test_body_above_the_limit_is_413_by_content_length(url: str) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        for path in ("/v1/chat/completions", "/rollouts/r/attempts/a/v1/chat/completions", "/admin/weights"):
            r = await http.post(f"{url}{path}", json=_prompt(2 * LIMIT))
            if path == "/admin/weights":
                assert r.status_code == 403  # refused even earlier: no admin token configured
                continue
            error = assert_openai_error(r, 413)
            assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
        assert (await http.post(f"{url}/v1/chat/completions", json=GOOD_CHAT)).status_code == 200  # keep-alive reused


async def test_chunked_body_above_the_limit_is_413(url: str) -> None:
    chunk = b'{"messages": [{"role": "user", "content": "' + b"x" * 65536

    async def body() -> AsyncIterator[bytes]:
        for _ in range(2 * LIMIT // len(chunk) + 2):
            yield chunk

    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{url}/v1/chat/completions", content=body(), headers={"content-type": "application/json"})
        assert assert_openai_error(r, 413)["code"] == "request_too_large"
        assert (await http.post(f"{url}/v1/chat/completions", json=GOOD_CHAT)).status_code == 200


async def test_prompt_that_cannot_fit_is_refused_before_tokenising(engine: TransformersEngine) -> None:
    """1.5 MB of text: tokenising it with the tiny model's tokenizer takes ~11 s; the bound answers at once."""
    async with serving(engine) as root, httpx.AsyncClient(timeout=60) as http:
        for stream in (False, True):
            start = time.perf_counter()
            r = await http.post(f"{root}/v1/chat/completions", json={**_prompt(1_500_000), "stream": stream})
            elapsed = time.perf_counter() - start
            error = assert_openai_error(r, 400, "messages")
            assert error["code"] == "context_length_exceeded" and "characters" in error["message"]
            assert elapsed < 2.0, elapsed
        r = await http.post(f"{root}/v1/completions", json={"prompt": "x" * 1_500_000, "max_tokens": 2})
        assert assert_openai_error(r, 400, "prompt")["code"] == "context_length_exceeded"


async def test_a_body_too_long_for_the_models_context_is_413_unread(engine: TransformersEngine) -> None:
    """Under the operator's 16 MiB limit, but longer than any prompt the context can hold: refused by its
    Content-Length (parsing 3 MB of JSON would hold the event loop for ~12 ms; 15 MB for ~60 ms)."""
    from lightning_rl.gateway.upstreams import EngineBackend

    bound = EngineBackend(engine).body_bound()
    assert bound is not None and bound < GatewayConfig().max_body_bytes
    async with serving(engine) as root, httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{root}/v1/chat/completions", json=_prompt(bound + 1_000_000))
        error = assert_openai_error(r, 413)
        assert error["code"] == "request_too_large" and "context" in error["message"] and str(bound) in error["message"]
        ok = await http.post(f"{root}/v1/chat/completions", json=_prompt(bound // 2))  # parsed, then 400
        assert assert_openai_error(ok, 400, "messages")["code"] == "context_length_exceeded"
        assert (await http.post(f"{root}/v1/chat/completions", json=GOOD_CHAT)).status_code == 200


async def test_long_prompt_is_tokenised_off_the_event_loop(engine: TransformersEngine) -> None:
    """A prompt just within the bound takes a while to tokenise; ``/health`` and small calls stay fast."""
    longest = max(len(t) for t in engine.tokenizer.get_vocab())
    chars = engine.max_context * longest - 1_000  # passes the bound, then fails on its token count
    async with serving(engine) as root, httpx.AsyncClient(timeout=120) as http:
        big = asyncio.create_task(http.post(f"{root}/v1/chat/completions", json=_prompt(chars)))
        await asyncio.sleep(0.05)
        worst = 0.0
        while not big.done():
            start = time.perf_counter()
            assert (await http.get(f"{root}/health")).status_code == 200
            worst = max(worst, time.perf_counter() - start)
            await asyncio.sleep(0.01)
        error = assert_openai_error(await big, 400, "messages")
        assert error["code"] == "context_length_exceeded" and "tokens long" in error["message"]
        assert worst < 0.5, worst
