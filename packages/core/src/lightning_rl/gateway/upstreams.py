"""What the gateway serves from: the embedded engine or an upstream OpenAI-compatible server.

Named *upstreams* (the classes keep their ``*Backend`` names): ``lightning_rl.backends`` is
something else, the training backends that update the policy. Both upstreams answer the same
small interface in the same neutral shapes (``CallSpec`` in, ``CallResult`` or a stream of
``StreamPiece`` out), so the gateway formats every API (chat completions, completions, responses)
and records every call the same way whatever served it.

- ``EngineBackend`` renders the chat template, generates with an ``InferenceEngine`` and reports
  the exact token ids and sampling logprobs: tokens are always exact.
- ``UpstreamBackend`` forwards to an OpenAI-compatible server and asks for vLLM's
  ``return_token_ids`` and for logprobs; when the upstream returns ids they are recorded as exact,
  otherwise only text is recorded and the call is marked inexact (nothing is re-tokenised).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from collections.abc import AsyncGenerator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal, Protocol, cast

import httpx

from lightning_rl.engine.base import InferenceEngine, ParsedToolCall, SamplingParams
from lightning_rl.errors import InvalidRequestError
from lightning_rl.gateway._http import LeanHTTPClient, resolve
from lightning_rl.gateway.protocol import GatewayHTTPError, dumpb, loads

__all__ = [
    "CallSpec",
    "ChoiceResult",
    "CallResult",
    "StreamPiece",
    "GatewayBackend",
    "OnResult",
    "call_in_task",
    "call_starter",
    "tool_calls_json",
    "EngineBackend",
    "UpstreamBackend",
    "RetryPolicy",
]


# --- Neutral shapes ---
@dataclass(slots=True)
class CallSpec:
    """One model call, whatever API it came through: ``messages``/``tools`` for chat, ``prompt`` (text
    or token ids) for completions; ``body`` is the client's JSON, forwarded (adjusted) upstream."""

    api: Literal["chat", "completion"]
    params: SamplingParams
    n: int = 1
    max_tokens_requested: int | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    prompt: str | list[int] | None = None
    want_logprobs: bool = False
    body: dict[str, Any] = field(default_factory=dict[str, Any])
    role: str | None = None
    """The agent role that made the call (the URL's ``/roles/...`` or ``X-Lightning-Role``), if any."""
    affinity: str | None = None
    """The rollout the call belongs to: a backend over several servers sends all of its calls to one
    (``ReplicaUpstream``), whose prefix cache then holds the conversation."""

    @property
    def parse_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"


@dataclass(slots=True)
class ChoiceResult:
    """One finished choice. ``text`` is everything generated (tool-call syntax included);
    ``content`` is what the client sees as the message content."""

    index: int
    text: str
    content: str | None
    finish_reason: str
    tool_calls: list[ParsedToolCall] = field(default_factory=list[ParsedToolCall])
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    logprob_entries: list[dict[str, Any]] | None = None
    model_version: int | None = None
    parse_error: str | None = None
    adapter: str | None = None
    """The LoRA adapter that produced the choice (per-role adapters), and its version."""
    adapter_version: int | None = None


@dataclass(slots=True)
class CallResult:
    prompt_ids: list[int] | None
    choices: list[ChoiceResult]
    tokens_exact: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(slots=True)
class StreamPiece:
    """A piece of a streamed choice (its last has ``finish_reason`` set): ``text`` is the content delta
    shown to the client, ``raw_text`` the generated text it came from when they differ (a tool call)."""

    index: int
    text: str = ""
    raw_text: str | None = None
    token_ids: list[int] = field(default_factory=list[int])
    logprobs: list[float] = field(default_factory=list[float])
    logprob_entries: list[dict[str, Any]] | None = None
    tool_call_deltas: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    model_version: int | None = None
    prompt_ids: list[int] | None = None
    parse_error: str | None = None
    usage: dict[str, Any] | None = None
    tokens_exact: bool = True
    adapter: str | None = None
    adapter_version: int | None = None


OnResult = Callable[[CallResult | None, BaseException | None], None]
"""Told how a non-streamed call ended: ``(result, None)`` or ``(None, error)``."""


class GatewayBackend(Protocol):
    """What the gateway app needs from a backend. It may also offer ``start_call(spec, on_done:
    OnResult)``: ``run`` reporting through a callback, so the gateway answers without a task per call
    (``UpstreamBackend`` does; see ``call_starter``)."""

    @property
    def model_name(self) -> str: ...

    @property
    def version(self) -> int | None: ...

    async def start(self) -> None: ...

    async def run(self, spec: CallSpec) -> CallResult: ...

    def stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]: ...

    async def load_weights(self, path: str | None, version: int) -> None: ...

    async def aclose(self) -> None: ...


def tool_calls_json(calls: Sequence[ParsedToolCall]) -> list[dict[str, Any]]:
    """Parsed tool calls as OpenAI's ``tool_calls`` objects."""
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


# --- Embedded engine ---
_INLINE_TOKENISE_CHARS = 16_384
"""Prompts up to this many characters are tokenised on the event loop (a thread hop would cost
more than it saves); longer ones on a worker thread."""


def _text_chars(value: Any) -> int:
    """Characters of the strings in a JSON value (iterative: JSON may nest past the recursion limit)."""
    total = 0
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, list | tuple):
            todo.extend(item)  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(item, dict):
            todo.extend(item.values())  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
    return total


BODY_SLACK = 1 << 20
"""Bytes allowed for the fields of a request that are not prompt text (see ``EngineBackend.body_bound``)."""


class EngineBackend:
    """Serve an ``InferenceEngine`` in-process (exact tokens, per-token sampling logprobs); with
    ``owns_engine`` its ``close()`` is called when the gateway shuts down."""

    def __init__(self, engine: InferenceEngine, *, owns_engine: bool = False) -> None:
        self.engine = engine
        self.owns_engine = owns_engine
        self._token_text: dict[int, str] = {}
        self._max_token_chars: int | None = None

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def version(self) -> int | None:
        return self.engine.version

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        if not self.owns_engine:
            return
        close = getattr(self.engine, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    async def load_weights(self, path: str | None, version: int) -> None:
        if path is None:
            raise InvalidRequestError("the embedded engine needs 'path': a state dict saved with torch.save.")
        import torch

        state: Mapping[str, Any] = await asyncio.to_thread(torch.load, path, map_location="cpu", weights_only=True)
        await self.engine.load_weights(state, version)

    def body_bound(self) -> int | None:
        """The largest request body whose prompt could still fit the context (``None``: unknown).

        ``_check_length`` refuses a longer prompt only once the body is parsed, and parsing JSON holds
        the event loop (about 4 ms per MB: a 15 MB body stalled every other call for 60 ms). JSON spells
        a character in at most 12 bytes (a ``\\uXXXX`` surrogate pair), so a body above 12 bytes per
        possible prompt character plus ``BODY_SLACK`` (the other fields) is refused by its length.
        """
        longest = self._longest_token()
        if longest is None:
            return None
        return 12 * self.engine.max_context * longest + BODY_SLACK

    # --- preparing a call -------------------------------------------------------------------
    def _longest_token(self) -> int | None:
        """The most characters one token stands for (``None``: unknown): a token's vocabulary string has at
        least as many characters as the text it decodes to (byte-level BPE writes one per byte)."""
        if self._max_token_chars is None:
            tokenizer = getattr(self.engine, "tokenizer", None)
            get_vocab = getattr(tokenizer, "get_vocab", None)
            try:
                vocab: Mapping[str, int] = cast("Mapping[str, int]", get_vocab()) if callable(get_vocab) else {}
                self._max_token_chars = max((len(t) for t in vocab), default=0)
            except Exception:  # a tokenizer without a readable vocabulary: no bound
                self._max_token_chars = 0
        return self._max_token_chars or None

    def _check_length(self, spec: CallSpec) -> int:
        """Refuse, before tokenising, a prompt longer than the context times ``_longest_token()``
        characters: counting them costs microseconds, tokenising a 10 MB prompt took seconds.
        Returns the characters counted."""
        if spec.api == "chat":
            chars = _text_chars(spec.messages) + _text_chars(spec.tools)
        else:
            chars = len(spec.prompt) if isinstance(spec.prompt, str) else 0  # 0: token ids
        longest = self._longest_token()
        if longest is None:
            return chars
        context = self.engine.max_context
        if chars > context * longest:
            raise _too_long(
                spec,
                f"the prompt has {chars} characters, more than the model's context of {context} tokens can hold "
                f"(at most {longest} characters per token); shorten the conversation.",
            )
        return chars

    async def _encode(self, spec: CallSpec) -> list[int]:
        """The prompt's ids: small prompts tokenised at once, long ones on a worker thread (seconds for
        megabytes with a slow tokenizer: on the event loop it stalled every call and ``/health``)."""
        if self._check_length(spec) <= _INLINE_TOKENISE_CHARS:
            return self._prompt_ids(spec)
        return await asyncio.to_thread(self._prompt_ids, spec)

    def _prompt_ids(self, spec: CallSpec) -> list[int]:
        if spec.api == "chat":
            assert spec.messages is not None
            try:
                return self.engine.encode_chat(spec.messages, spec.tools or None)
            except Exception as exc:  # KeyError and the like, jinja2's errors (raise_exception in a template)
                raise InvalidRequestError(f"could not render the messages with the chat template: {exc}") from exc
        if isinstance(spec.prompt, str):
            return self.engine.encode_text(spec.prompt)
        assert spec.prompt is not None
        return list(spec.prompt)

    def _params(self, spec: CallSpec, prompt_len: int) -> SamplingParams:
        context = self.engine.max_context
        if prompt_len >= context:
            raise _too_long(
                spec,
                f"the prompt is {prompt_len} tokens long but the model's context is {context} tokens; "
                "shorten the conversation (leave room for the completion).",
            )
        return replace(spec.params, max_tokens=min(spec.params.max_tokens, context - prompt_len))

    def _token_entry(self, token_id: int, logprob: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.engine.decode([token_id])
            if len(self._token_text) < 200_000:
                self._token_text[token_id] = text
        entry: dict[str, Any] = {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        entry["top_logprobs"] = [self._token_entry(t, lp, None) for t, lp in top] if top else []
        return entry

    def _entries(
        self, ids: Sequence[int], logprobs: Sequence[float], top: Sequence[list[tuple[int, float]]] | None
    ) -> list[dict[str, Any]]:
        return [
            self._token_entry(t, lp, top[i] if top else None)
            for i, (t, lp) in enumerate(zip(ids, logprobs, strict=False))
        ]

    def _finish(self, spec: CallSpec, index: int, text: str, reason: str) -> ChoiceResult:
        if spec.parse_tools:
            parsed = self.engine.parse_assistant(text)
            finish = "tool_calls" if parsed.tool_calls and reason == "stop" else reason
            return ChoiceResult(index, text, parsed.content, finish, parsed.tool_calls, parse_error=parsed.parse_error)
        return ChoiceResult(index, text, text, "stop" if reason == "tool_calls" else reason)

    # --- non-streaming ----------------------------------------------------------------------
    async def run(self, spec: CallSpec) -> CallResult:
        prompt_ids = await self._encode(spec)
        params = self._params(spec, len(prompt_ids))
        outs = await asyncio.gather(*(self.engine.generate(prompt_ids, _seeded(params, i)) for i in range(spec.n)))
        choices: list[ChoiceResult] = []
        for i, out in enumerate(outs):
            choice = self._finish(spec, i, out.text, out.finish_reason)
            choice.token_ids = out.token_ids
            choice.logprobs = out.logprobs
            choice.model_version = out.model_version
            choice.adapter, choice.adapter_version = out.adapter, out.adapter_version
            if spec.want_logprobs:
                choice.logprob_entries = self._entries(out.token_ids, out.logprobs, out.top_logprobs)
            choices.append(choice)
        completion = sum(len(c.token_ids or ()) for c in choices)
        return CallResult(prompt_ids, choices, True, len(prompt_ids), completion)

    # --- streaming --------------------------------------------------------------------------
    async def stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]:
        prompt_ids = await self._encode(spec)
        params = self._params(spec, len(prompt_ids))
        if spec.n == 1:
            async for piece in self._stream_choice(spec, 0, prompt_ids, params):
                yield piece
            return
        # n > 1: run the choices concurrently (the engine batches them) and interleave their pieces.
        queue: asyncio.Queue[StreamPiece | BaseException | None] = asyncio.Queue()

        async def pump(i: int) -> None:
            try:
                async for piece in self._stream_choice(spec, i, prompt_ids, _seeded(params, i)):
                    queue.put_nowait(piece)
                queue.put_nowait(None)
            except Exception as exc:
                queue.put_nowait(exc)

        tasks = [asyncio.create_task(pump(i)) for i in range(spec.n)]
        try:
            done = 0
            while done < spec.n:
                item = await queue.get()
                if item is None:
                    done += 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream_choice(
        self, spec: CallSpec, index: int, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[StreamPiece]:
        buffer = spec.parse_tools  # tool-call syntax must not leak out as content: hold the text back
        ids: list[int] = []
        lps: list[float] = []
        texts: list[str] = []
        first = True
        iterator = self.engine.stream(prompt_ids, params)
        try:
            async for d in iterator:
                if not buffer:
                    yield StreamPiece(
                        index,
                        d.text,
                        token_ids=d.token_ids,
                        logprobs=d.logprobs,
                        logprob_entries=self._entries(d.token_ids, d.logprobs, None) if spec.want_logprobs else None,
                        finish_reason=("stop" if d.finish_reason == "tool_calls" else d.finish_reason),
                        model_version=d.model_version,
                        prompt_ids=prompt_ids if first else None,
                        adapter=d.adapter,
                        adapter_version=d.adapter_version,
                    )
                    first = False
                    continue
                ids += d.token_ids
                lps += d.logprobs
                texts.append(d.text)
                if d.finish_reason is None:
                    continue
                text = "".join(texts)
                choice = self._finish(spec, index, text, d.finish_reason)
                yield StreamPiece(
                    index,
                    choice.content or "",
                    raw_text=text,
                    token_ids=ids,
                    logprobs=lps,
                    logprob_entries=self._entries(ids, lps, None) if spec.want_logprobs else None,
                    tool_call_deltas=[{"index": i, **c} for i, c in enumerate(tool_calls_json(choice.tool_calls))]
                    or None,
                    finish_reason=choice.finish_reason,
                    model_version=d.model_version,
                    prompt_ids=prompt_ids,
                    parse_error=choice.parse_error,
                    adapter=d.adapter,
                    adapter_version=d.adapter_version,
                )
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                await aclose()  # frees the request's batch slot when the client went away


def _too_long(spec: CallSpec, message: str) -> GatewayHTTPError:
    return GatewayHTTPError(
        400, message, param="messages" if spec.api == "chat" else "prompt", code="context_length_exceeded"
    )


def _seeded(params: SamplingParams, i: int) -> SamplingParams:
    """Choice ``i`` of a seeded ``n > 1`` call gets its own seed, so choices differ yet reproduce."""
    if params.seed is None or i == 0:
        return params
    return replace(params, seed=params.seed + i)


# --- Upstream OpenAI-compatible server ---
@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When the gateway asks an upstream again instead of passing its failure on to the agent.

    Only failures that mean no answer was given are retried: a refused or dropped connection and the
    ``statuses``; never a timeout (a hung server would hold the call as long again), nor a stream once
    its first piece went to the client (the agent would see two answers). Retries are capped per call
    (``tries``) and overall: each call earns ``budget`` of a retry, so a server failing every call
    gets at most that fraction more load from retries, not a multiple of it.
    """

    tries: int = 3
    """Tries per call in all (1: never retry)."""
    backoff_s: float = 0.05
    """Wait before the first retry; it doubles for each further one (jittered), up to ``max_backoff_s``."""
    max_backoff_s: float = 2.0
    budget: float = 0.2
    """Retries earned per call."""
    reserve: float = 10.0
    """Retries available at start, and the most that can be saved up."""
    statuses: frozenset[int] = frozenset({408, 409, 429, 500, 502, 503, 504})


class _RetryBudget:
    """A token bucket of retries (see ``RetryPolicy``)."""

    __slots__ = ("policy", "tokens", "retried")

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.tokens = policy.reserve
        self.retried = 0

    def earn(self) -> None:
        self.tokens = min(self.policy.reserve, self.tokens + self.policy.budget)

    def delay(self, tries: int, status: int, exc: BaseException | None) -> float | None:
        """Seconds to wait before try ``tries + 1`` of a call that failed so; ``None``: no retry."""
        policy = self.policy
        if tries >= policy.tries or self.tokens < 1.0:
            return None
        if isinstance(exc, TimeoutError | httpx.TimeoutException) or (exc is None and status not in policy.statuses):
            return None
        self.tokens -= 1.0
        self.retried += 1
        backoff = min(policy.max_backoff_s, policy.backoff_s * 2 ** (tries - 1))
        return backoff * (0.5 + random.random() / 2)


@dataclass(slots=True)
class _Try:
    """A non-streamed upstream call between its tries."""

    spec: CallSpec
    path: str
    content: bytes
    on_done: OnResult
    tries: int = 1


class UpstreamBackend:
    """Forward calls to an OpenAI-compatible server (vLLM, or any other).

    Args:
        url: The server's base URL, with or without the trailing ``/v1``.
        api_key: Sent as a bearer token to the upstream.
        model: The upstream's model name; by default the first one ``/v1/models`` lists.
        timeout_s: Longest wait for one upstream call.
        max_connections: Connection-pool size towards the upstream.
        retry: When a failed call is tried again (``RetryPolicy(tries=1)``: never).
        verify: For an ``https://`` upstream: ``True`` (the system's CAs), a CA bundle's path, or an
            ``ssl.SSLContext`` (a server with a private certificate).
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        model: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 512,
        retry: RetryPolicy | None = None,
        verify: ssl.SSLContext | str | bool = True,
    ) -> None:
        base = url.rstrip("/")
        self.url = base[: -len("/v1")] if base.endswith("/v1") else base
        self._model = model
        self._version = 0
        self.retries = _RetryBudget(retry or RetryPolicy())
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            verify=verify,
        )
        # the hot non-streamed path uses a lean keep-alive client (see _http); https goes through httpx
        self._lean = (
            LeanHTTPClient(self.url, headers, timeout_s=timeout_s, max_idle=max_connections)
            if self.url.startswith("http://")
            else None
        )
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def model_name(self) -> str:
        return self._model or "upstream"

    @property
    def version(self) -> int | None:
        return self._version

    async def start(self) -> None:
        if self._model is not None:
            return
        try:
            resp = await self._client.get("/v1/models")
            resp.raise_for_status()
            models = resp.json().get("data") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise ConnectionError(
                f"could not list the models of the upstream {self.url} ({exc}); start it or pass its model name."
            ) from exc
        if not models:
            raise ConnectionError(f"the upstream {self.url} serves no model; pass its model name explicitly.")
        self._model = str(models[0]["id"])

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._lean is not None:
            await self._lean.aclose()

    async def load_weights(self, path: str | None, version: int) -> None:
        # The trainer updates the upstream server's weights itself; the gateway only records the version.
        self._version = version

    # --- helpers ----------------------------------------------------------------------------
    def _body(self, spec: CallSpec, stream: bool) -> tuple[str, bytes]:
        body = dict(spec.body)
        if self._model is not None:
            body["model"] = self._model
        body["return_token_ids"] = True  # vLLM: prompt_token_ids + token_ids, the exact tokens
        body["stream"] = stream
        if stream:
            body["stream_options"] = {"include_usage": True}
        else:
            body.pop("stream_options", None)
        if spec.api == "chat":
            body["logprobs"] = True
            path = "/v1/chat/completions"
        else:
            body["prompt"] = spec.prompt
            body["n"] = spec.n
            if not isinstance(body.get("logprobs"), int):
                body["logprobs"] = 0  # the sampled token's logprob only
            path = "/v1/completions"
        return path, dumpb(body)

    def _unavailable(self, exc: BaseException) -> GatewayHTTPError:
        return GatewayHTTPError(
            503,
            f"the upstream model server {self.url} is unavailable ({type(exc).__name__}: {exc}); retry later.",
            type="service_unavailable",
            code="upstream_unavailable",
        )

    @staticmethod
    def _upstream_error(status: int, text: str) -> GatewayHTTPError:
        message = text[:2000]
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            message = str(loads(text)["error"]["message"])
        if status >= 500:
            return GatewayHTTPError(502, f"the upstream model server failed: {message}", type="upstream_error")
        return GatewayHTTPError(status, message)

    # --- non-streaming ----------------------------------------------------------------------
    async def run(self, spec: CallSpec) -> CallResult:
        """A non-streamed call, awaited (the gateway uses the callback form, ``start_call``)."""
        future: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self.start_call(spec, partial(resolve, future))
        return await future

    def start_call(self, spec: CallSpec, on_done: OnResult) -> None:
        """Start a non-streamed call; ``on_done`` is called once when it ends, retries included (over
        plain ``http://`` from the lean client's callback: no task, no future)."""
        path, content = self._body(spec, stream=False)
        self.retries.earn()
        self._send(_Try(spec, path, content, on_done))

    def _send(self, t: _Try) -> None:
        if self._lean is None:
            task = asyncio.get_running_loop().create_task(self._post_httpx(t))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        self._lean.start(t.path, t.content, partial(self._answered, t))

    def _answered(self, t: _Try, status: int, raw: bytes, exc: BaseException | None) -> None:
        if (exc is not None or status >= 400) and (delay := self.retries.delay(t.tries, status, exc)) is not None:
            t.tries += 1
            asyncio.get_running_loop().call_later(delay, self._send, t)
            return
        if exc is not None:
            t.on_done(None, self._unavailable(exc))
            return
        try:
            result = self._result(t.spec, status, raw)
        except Exception as error:
            t.on_done(None, error)
            return
        t.on_done(result, None)

    async def _post_httpx(self, t: _Try) -> None:
        try:
            resp = await self._client.post(t.path, content=t.content)
        except httpx.TransportError as exc:
            self._answered(t, 0, b"", exc)
            return
        self._answered(t, resp.status_code, resp.content, None)

    def _result(self, spec: CallSpec, status: int, raw: bytes) -> CallResult:
        if status >= 400:
            raise self._upstream_error(status, raw.decode(errors="replace"))
        data: dict[str, Any] = loads(raw)
        raw_choices: list[dict[str, Any]] = data.get("choices") or []
        prompt_ids = data.get("prompt_token_ids")
        if prompt_ids is None and raw_choices:
            prompt_ids = raw_choices[0].get("prompt_token_ids")
        choices = [self._choice(spec, c) for c in raw_choices]
        exact = prompt_ids is not None and all(c.token_ids is not None for c in choices)
        usage: dict[str, Any] = data.get("usage") or {}
        if exact:
            prompt_tokens: int | None = len(prompt_ids or ())
            completion_tokens: int | None = sum(len(c.token_ids or ()) for c in choices)
        else:
            prompt_tokens = usage.get("prompt_tokens")
            completion_tokens = usage.get("completion_tokens")
        return CallResult(prompt_ids, choices, exact, prompt_tokens, completion_tokens)

    def _choice(self, spec: CallSpec, c: dict[str, Any]) -> ChoiceResult:
        index = int(c.get("index", 0))
        reason = str(c.get("finish_reason") or "stop")
        token_ids = c.get("token_ids")
        entries = _logprob_entries(spec, c.get("logprobs"))
        if spec.api == "chat":
            msg: dict[str, Any] = c.get("message") or {}
            content = msg.get("content")
            calls = [_parsed_call(tc) for tc in msg.get("tool_calls") or ()]
            text = content or ""
        else:
            content = text = str(c.get("text") or "")
            calls = []
        logprobs = [float(e["logprob"]) for e in entries] if entries is not None else None
        return ChoiceResult(
            index,
            text,
            content,
            reason,
            calls,
            token_ids=token_ids,
            logprobs=logprobs,
            logprob_entries=entries,
            model_version=self._version,
        )

    # --- streaming --------------------------------------------------------------------------
    async def stream(self, spec: CallSpec) -> AsyncGenerator[StreamPiece]:
        """A streamed call, retried (see ``RetryPolicy``) only until its first piece is yielded."""
        path, content = self._body(spec, stream=True)
        self.retries.earn()
        tries, sent = 1, False
        while True:
            try:
                async with self._client.stream("POST", path, content=content) as resp:
                    if resp.status_code < 400:
                        async with contextlib.aclosing(self._pieces(spec, resp)) as pieces:
                            async for piece in pieces:
                                sent = True
                                yield piece
                        return
                    text = (await resp.aread()).decode(errors="replace")
                    if (delay := self.retries.delay(tries, resp.status_code, None)) is None:
                        raise self._upstream_error(resp.status_code, text)
            except httpx.TransportError as exc:
                if sent or (delay := self.retries.delay(tries, 0, exc)) is None:
                    raise self._unavailable(exc) from exc
            tries += 1
            await asyncio.sleep(delay)

    async def _pieces(self, spec: CallSpec, resp: httpx.Response) -> AsyncGenerator[StreamPiece]:
        prompt_ids: list[int] | None = None
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk: dict[str, Any] = loads(payload)
            if prompt_ids is None:
                prompt_ids = chunk.get("prompt_token_ids")
            for c in chunk.get("choices") or ():
                if prompt_ids is None:
                    prompt_ids = c.get("prompt_token_ids")
                yield self._piece(spec, c, prompt_ids)
            if chunk.get("usage") and not chunk.get("choices"):
                yield StreamPiece(-1, usage=chunk["usage"], prompt_ids=prompt_ids)

    def _piece(self, spec: CallSpec, c: dict[str, Any], prompt_ids: list[int] | None) -> StreamPiece:
        token_ids = c.get("token_ids")
        entries = _logprob_entries(spec, c.get("logprobs"))
        if spec.api == "chat":
            delta: dict[str, Any] = c.get("delta") or {}
            text = delta.get("content") or ""
            tool_deltas = delta.get("tool_calls") or None
        else:
            text = c.get("text") or ""
            tool_deltas = None
        return StreamPiece(
            int(c.get("index", 0)),
            text,
            token_ids=list(token_ids or ()),
            logprobs=[float(e["logprob"]) for e in entries] if entries else [],
            logprob_entries=entries,
            tool_call_deltas=tool_deltas,
            finish_reason=c.get("finish_reason"),
            model_version=self._version,
            prompt_ids=prompt_ids,
            tokens_exact=token_ids is not None or not (text or tool_deltas),
        )


_running: set[asyncio.Task[CallResult]] = set()
"""Tasks of ``call_in_task`` until they end: the event loop keeps only weak references to tasks."""


def call_in_task(call: Coroutine[Any, Any, CallResult], on_done: OnResult) -> None:
    """Run ``call`` in a task that reports through ``on_done`` (for work that has to await)."""
    task = asyncio.get_running_loop().create_task(call)
    _running.add(task)
    task.add_done_callback(partial(_task_done, on_done))


def call_starter(backend: GatewayBackend) -> Callable[[CallSpec, OnResult], None]:
    """How to start a non-streamed call of ``backend``: its ``start_call`` (no task per call) when it
    has one, else its ``run`` in a task."""
    start: Callable[[CallSpec, OnResult], None] | None = getattr(backend, "start_call", None)
    return start or (lambda spec, on_done: call_in_task(backend.run(spec), on_done))


def _task_done(on_done: OnResult, task: asyncio.Task[CallResult]) -> None:
    _running.discard(task)
    if task.cancelled():
        on_done(None, asyncio.CancelledError())
    elif (exc := task.exception()) is not None:
        on_done(None, exc)
    else:
        on_done(task.result(), None)


def _parsed_call(tc: dict[str, Any]) -> ParsedToolCall:
    fn: dict[str, Any] = tc.get("function") or {}
    return ParsedToolCall(str(tc.get("id") or ""), str(fn.get("name") or ""), str(fn.get("arguments") or ""))


def _logprob_entries(spec: CallSpec, logprobs: Any) -> list[dict[str, Any]] | None:
    """An upstream choice's logprobs as chat-style entries (legacy completions send parallel lists)."""
    if not isinstance(logprobs, dict):
        return None
    if spec.api == "chat":
        content = logprobs.get("content")
        return content if isinstance(content, list) else None
    tokens: list[str] = logprobs.get("tokens") or []
    values: list[float | None] = logprobs.get("token_logprobs") or []
    tops: list[dict[str, float] | None] = logprobs.get("top_logprobs") or []
    out: list[dict[str, Any]] = []
    for i, (tok, lp) in enumerate(zip(tokens, values, strict=False)):
        top = tops[i] if i < len(tops) else None
        out.append(
            {
                "token": tok,
                "logprob": float(lp if lp is not None else 0.0),
                "bytes": list(tok.encode()),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in (top or {}).items()],
            }
        )
    return out
