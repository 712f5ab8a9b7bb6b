"""A scripted LLM judge speaking the OpenAI chat API (a test double), for ``lightning_rl.rewards``.

``FakeJudge`` is a real HTTP server (``async with judge.running() as url``, or
``with judge.serving_in_thread() as url`` for a process that trains in a subprocess). It reads the
trajectories out of the judge prompt (``<trajectory id="k">...</trajectory>`` blocks), scores each
with ``scorer(text)`` (or by its position, ``position_scorer(position, n)``, to play a biased
judge), and answers as a chat completion with ``usage``. ``faults`` script how the next requests go
wrong, one per request, in order: ``"malformed"`` (prose, no scores), ``"out_of_range"`` (every
score times 10), ``"wrong_count"`` (one score missing), ``"empty"`` (no content), ``"429"`` (with a
``Retry-After`` header), ``"500"``, ``"503"``, ``"400"``, ``"401"``, ``"timeout"`` (answers only
after ``slow_s``) and ``"ok"``. ``supports_json_schema=False`` plays an endpoint that rejects a
JSON-schema ``response_format`` with HTTP 400. Every request body is kept in ``requests`` and the
trajectories each request showed, in its order, in ``shown``.

A request of the ``logprobs`` scoring mode (its system prompt is ``DIGIT_SYSTEM_PROMPT``: one
trajectory, one digit) is answered with one token and, when it asks for them, its top logprobs:
``digit_logprobs(text)`` scripts them as ``(token, probability)`` pairs; by default they spread 80%
over the two digits around ``9 * scorer(text)`` (so the weighted mean is exactly the score) and the
rest over two tokens that are not digits. A ``"malformed"`` fault answers with no digit among them.
``supports_logprobs=False`` plays an endpoint that ignores ``logprobs`` (the text is the nearest
digit); ``rejects_logprobs=True`` one that refuses them with HTTP 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lightning_rl.rewards.digits import DIGIT_SYSTEM_PROMPT

__all__ = ["FakeJudge", "trajectories_in", "digit_distribution"]

_TRAJECTORY = re.compile(r'<trajectory id="(\d+)">\n(.*?)\n</trajectory>', re.S)


def trajectories_in(body: dict[str, Any]) -> list[str]:
    """The trajectory texts of a judge request, in the order it shows them."""
    text = "\n".join(str(m.get("content") or "") for m in body.get("messages", []))
    return [t for _, t in sorted(((int(i), t) for i, t in _TRAJECTORY.findall(text)), key=lambda p: p[0])]


class FakeJudge:
    """A scripted OpenAI-compatible judge (a test double; see the module docstring).

    Args:
        scorer: Score of one trajectory's text (default 0.5 for all).
        model: The model name it serves (any other gets HTTP 404).
        faults: How the next requests fail, one entry per request.
        supports_json_schema: Whether a JSON-schema ``response_format`` is accepted.
        position_scorer: Score by position instead (``position`` 0-based, ``n`` trajectories).
        fenced: Wrap the JSON in prose and a markdown code fence, as small models do.
        slow_s: How long a ``"timeout"`` fault waits before answering.
        delay_s: How long every answer takes (``max_in_flight`` then shows the caller's concurrency).
        digit_logprobs: The top tokens of a ``logprobs``-mode answer about one trajectory, as
            ``(token, probability)`` pairs (default: ``digit_distribution(scorer(text))``).
        supports_logprobs: Whether ``logprobs`` are returned when asked for (False: ignored).
        rejects_logprobs: Answer a request asking for ``logprobs`` with HTTP 400.
    """

    def __init__(
        self,
        scorer: Callable[[str], float] | None = None,
        *,
        model: str = "fake-judge",
        faults: Sequence[str] = (),
        supports_json_schema: bool = True,
        position_scorer: Callable[[int, int], float] | None = None,
        fenced: bool = False,
        slow_s: float = 5.0,
        delay_s: float = 0.0,
        digit_logprobs: Callable[[str], Sequence[tuple[str, float]]] | None = None,
        supports_logprobs: bool = True,
        rejects_logprobs: bool = False,
    ) -> None:
        self.scorer: Callable[[str], float] = scorer or _even
        self.model = model
        self.faults = list(faults)
        self.supports_json_schema = supports_json_schema
        self.position_scorer = position_scorer
        self.fenced = fenced
        self.slow_s = slow_s
        self.delay_s = delay_s
        self.digit_logprobs = digit_logprobs
        self.supports_logprobs = supports_logprobs
        self.rejects_logprobs = rejects_logprobs
        self.in_flight = 0
        self.max_in_flight = 0
        """The most requests it was answering at once."""
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.shown: list[list[str]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    def _scores(self, texts: Sequence[str]) -> list[float]:
        if self.position_scorer is not None:
            return [self.position_scorer(i, len(texts)) for i in range(len(texts))]
        return [self.scorer(t) for t in texts]

    async def _chat(self, request: Request) -> Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        fault = self.faults.pop(0) if self.faults else "ok"
        if body.get("model") != self.model:
            return _error(404, f"model {body.get('model')!r} not found")
        if fault in ("400", "401", "500", "503"):
            return _error(int(fault), f"scripted HTTP {fault}")
        if fault == "429":
            return _error(429, "rate limited", headers={"retry-after": "0.01"})
        response_format: dict[str, Any] = body.get("response_format") or {}
        if response_format.get("type") == "json_schema" and not self.supports_json_schema:
            return _error(400, "response_format type 'json_schema' is not supported by this model")
        if fault == "timeout":
            await asyncio.sleep(self.slow_s)
        texts = trajectories_in(body)
        self.shown.append(texts)
        messages: list[dict[str, Any]] = body.get("messages") or [{}]
        if messages[0].get("content") == DIGIT_SYSTEM_PROMPT:
            if body.get("logprobs") and self.rejects_logprobs:
                return _error(400, "logprobs are not supported by this model")
            return self._digit_answer(body, texts[0] if texts else "", fault)
        scores = self._scores(texts)
        if fault == "out_of_range":
            scores = [s * 10 + 1 for s in scores]
        entries = [{"trajectory_id": i, "explanation": "scripted", "score": s} for i, s in enumerate(scores, 1)]
        if fault == "wrong_count":
            entries = entries[:-1]
        content: str | None = json.dumps({"scores": entries})
        if fault == "malformed":
            content = "I think the second one is better, but they are all quite good."
        elif fault == "empty":
            content = None
        elif self.fenced:
            content = f"Here are my scores:\n```json\n{content}\n```\nHope this helps."
        prompt_chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": len(content or "") // 4}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return JSONResponse(
            {
                "id": f"chatcmpl-judge-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": usage,
            }
        )

    def _digit_answer(self, body: dict[str, Any], text: str, fault: str) -> Response:
        """One token about one trajectory (the ``logprobs`` scoring mode), with its top logprobs if asked."""
        if fault == "malformed":
            top: list[tuple[str, float]] = [("The", 0.6), ("Good", 0.3), ("\n", 0.1)]
        elif self.digit_logprobs is not None:
            top = list(self.digit_logprobs(text))
        else:
            top = digit_distribution(self.position_scorer(0, 1) if self.position_scorer else self.scorer(text))
        top.sort(key=lambda pair: -pair[1])
        if self.supports_logprobs:
            content: str | None = top[0][0] if top else ""
        else:  # what an endpoint that ignores logprobs writes: its most likely digit, else its most likely token
            digits = [(t, p) for t, p in top if t.strip().isdigit()]
            content = (digits or top or [("", 1.0)])[0][0]
        if fault == "empty":
            content = None
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "length",
            "logprobs": None,
        }
        if body.get("logprobs") and self.supports_logprobs and top:
            k = int(body.get("top_logprobs") or 0)
            entries = [{"token": t, "logprob": math.log(p), "bytes": list(t.encode())} for t, p in top if p > 0]
            choice["logprobs"] = {"content": [{**entries[0], "top_logprobs": entries[:k]}]}
        prompt_chars = sum(len(str(m.get("content") or "")) for m in body.get("messages", []))
        usage = {"prompt_tokens": prompt_chars // 4, "completion_tokens": 1, "total_tokens": prompt_chars // 4 + 1}
        return JSONResponse(
            {
                "id": f"chatcmpl-judge-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": usage,
            }
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncGenerator[str]:
        """Serve on a free loopback port in this event loop; yields the base URL (ending in ``/v1``)."""
        from lightning_rl.gateway.server import running_gateway

        async with running_gateway(self.app) as url:
            yield f"{url}/v1"

    @contextlib.contextmanager
    def serving_in_thread(self) -> Generator[str]:
        """Serve from a background thread (its own event loop) while the block runs; yields the base URL."""
        ready = threading.Event()
        state: dict[str, Any] = {}

        async def serve() -> None:
            state["loop"], state["stop"] = asyncio.get_running_loop(), asyncio.Event()
            async with self.running() as url:
                state["url"] = url
                ready.set()
                await state["stop"].wait()

        def main() -> None:
            try:
                asyncio.run(serve())
            except BaseException as exc:  # reported to the caller below
                state["error"] = exc
                ready.set()

        thread = threading.Thread(target=main, name="fake-judge", daemon=True)
        thread.start()
        ready.wait(30)
        if "url" not in state:
            raise RuntimeError(f"the fake judge did not start: {state.get('error', 'timed out after 30 s')}")
        try:
            yield str(state["url"])
        finally:
            state["loop"].call_soon_threadsafe(state["stop"].set)
            thread.join(10)


def digit_distribution(score: float) -> list[tuple[str, float]]:
    """Top tokens whose digits' weighted mean over 9 is ``score``: 80% over the digits on either side of
    ``9 * score``, 15% on ``"The"`` and 5% on ``" "`` (tokens a real model ranks high that are not digits)."""
    x = min(max(score, 0.0), 1.0) * 9
    low = min(int(math.floor(x)), 9)
    high_share = x - low
    pairs = [(str(low), 0.8 * (1 - high_share)), ("The", 0.15), (" ", 0.05)]
    if high_share > 0:
        pairs.append((str(low + 1), 0.8 * high_share))
    return sorted(((t, p) for t, p in pairs if p > 0), key=lambda pair: -pair[1])


def _even(_text: str) -> float:
    return 0.5


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    error = {"message": message, "type": "error", "code": status}
    return JSONResponse({"error": error}, status_code=status, headers=headers)
