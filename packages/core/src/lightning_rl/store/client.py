"""A ``LightningStore`` that talks to a store server over HTTP.

Runners on other machines (or in other processes) use ``StoreClient`` exactly like an in-process
store: every protocol method is one HTTP request to ``lightning-rl store serve``. The client is light
(pydantic and the standard library's asyncio streams; no web framework), so agent-side installs can
use it, and cheap per request, so one runner process can drive hundreds of concurrent rollouts. Pass
an ``httpx.AsyncClient`` as ``http_client`` when you need proxies or custom TLS.

Failures are handled the way the store's guarantees allow:

* Connection errors, timeouts and 5xx answers are retried with exponential backoff; 4xx answers are
  never retried (a client mistake stays a mistake) and raise the exception class the server raised,
  rebuilt with ``error_from_status``.
* Retrying writes is safe because writes are idempotent: ``enqueue`` on the rollout id, ``add_spans``
  on ``(trace_id, span_id)``. A retried ``finish_attempt`` whose first try did land is recognised
  (the attempt already has the requested status) and answered with the rollout instead of a 409.
* ``claim`` cannot be made idempotent without a claim token; if a claim's response is lost, the
  attempt it opened is orphaned and the store recovers it through the rollout's heartbeat timeout
  (it times out and is requeued). Give rollouts a ``heartbeat_timeout_s`` when workers are remote.
* ``add_resources`` is retried only when the request provably never reached the server (connect
  errors), since a second publish would create a second version.

The request and response bodies below (``*Body`` / ``*List``) are the wire format; the server
imports them, so both sides cannot disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from lightning_rl.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    LightningError,
    StoreUnavailableError,
    error_from_status,
)
from lightning_rl.store.base import attempt_timeout, check_reward
from lightning_rl.types import (
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
)

if TYPE_CHECKING:
    import httpx

__all__ = [
    "StoreClient",
    "TransportError",
    # wire format
    "EnqueueBody",
    "ClaimBody",
    "FinishBody",
    "IdsBody",
    "QueryRolloutsBody",
    "WaitBody",
    "SpansBody",
    "QuerySpansBody",
    "ResourcesBody",
    "ExpireBody",
    "PruneBody",
    "RolloutList",
    "ClaimList",
    "AttemptList",
    "SpanList",
    "Count",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# Wire format
# --------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueBody(_Body):
    requests: list[RolloutRequest]


class ClaimBody(_Body):
    worker_id: str
    n: int = 1
    timeout_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class FinishBody(_Body):
    status: AttemptStatus
    error: str | None = None
    reward: float | None = Field(default=None, allow_inf_nan=False)


class IdsBody(_Body):
    ids: list[str]


class QueryRolloutsBody(_Body):
    ids: list[str] | None = None
    status: list[RolloutStatus] | None = None
    group_id: str | None = None
    mode: str | None = None
    limit: int = 1000
    offset: int = 0


class WaitBody(_Body):
    ids: list[str]
    timeout_s: float = Field(ge=0, le=86_400)


class SpansBody(_Body):
    spans: list[Span]


class QuerySpansBody(_Body):
    rollout_id: str | None = None
    attempt_id: str | None = None
    name: str | None = None
    limit: int = 10_000
    offset: int = 0


class ResourcesBody(_Body):
    llm: LLMResource | None = None
    prompts: dict[str, str] | None = None
    extra: dict[str, Any] | None = None


class ExpireBody(_Body):
    now: float | None = None


class PruneBody(_Body):
    older_than: float


class RolloutList(_Body):
    rollouts: list[Rollout]


class ClaimList(_Body):
    claims: list[Claim]


class AttemptList(_Body):
    attempts: list[Attempt]


class SpanList(_Body):
    spans: list[Span]


class Count(_Body):
    count: int


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------

_RETRY_STATUS_MIN = 500


class _Retried(Exception):
    """Internal marker: the request failed after at least one earlier try that may have landed."""


class TransportError(ConnectionError):
    """The request did not get a complete HTTP response. ``sent`` is False when it provably never
    reached the server (the connection could not be opened), so even a non-idempotent call may retry."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class _Transport(Protocol):
    async def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]: ...

    async def aclose(self) -> None: ...


class _Http11Pool:
    """A small keep-alive HTTP/1.1 connection pool on asyncio streams.

    Why not httpx's pool: at a few hundred concurrent requests its connection bookkeeping (every
    request scans every pooled connection) costs more CPU than the store call itself. This pool is
    a LIFO stack of idle connections: one pop, one write, one read per request.
    """

    def __init__(self, url: str, max_connections: int) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequestError(f"store URL must look like http://host:port, got {url!r}.")
        self._host = parts.hostname
        self._tls = parts.scheme == "https"
        self._port = parts.port or (443 if self._tls else 80)
        default_port = parts.port is None or parts.port == (443 if self._tls else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._host_header = host if default_port else f"{host}:{self._port}"
        self._prefix = parts.path.rstrip("/")
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._open: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]:
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", f"host: {self._host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"content-length: {len(body) if body is not None else 0}")
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            for writer in self._open:
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    writer.close()
            self._idle.clear()
            self._open.clear()
            self._slots = asyncio.Semaphore(self._max_connections)
            self._loop = loop
        async with self._slots:
            try:
                async with asyncio.timeout(timeout_s):
                    conn = None
                    while self._idle and conn is None:
                        conn = self._idle.pop()
                        if conn[0].at_eof():  # the server closed it while it sat idle
                            self._close(conn[1])
                            conn = None
                    # No silent resend on a failed reused connection: the server may have applied
                    # the request and lost only the answer; ``StoreClient`` decides what is safe.
                    return await self._exchange(conn or await self._connect(), payload)
            except TransportError:
                raise
            except (OSError, EOFError, TimeoutError, asyncio.LimitOverrunError, ValueError) as exc:
                raise TransportError(f"{type(exc).__name__}: {exc}", sent=True) from exc

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            if self._tls:
                conn = await asyncio.open_connection(self._host, self._port, ssl=ssl.create_default_context())
            else:
                conn = await asyncio.open_connection(self._host, self._port)
        except (OSError, TimeoutError) as exc:
            raise TransportError(f"cannot connect to {self._host}:{self._port}: {exc}", sent=False) from exc
        self._open.add(conn[1])
        return conn

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], payload: bytes
    ) -> tuple[int, bytes]:
        reader, writer = conn
        try:
            writer.write(payload)
            await writer.drain()
            status, content, keep_alive = await _read_response(reader)
        except BaseException:
            self._close(writer)  # half-used: never hand it out again
            raise
        if keep_alive:
            self._idle.append(conn)
        else:
            self._close(writer)
        return status, content

    def _close(self, writer: asyncio.StreamWriter) -> None:
        self._open.discard(writer)
        writer.close()

    async def aclose(self) -> None:
        self._idle.clear()
        writers = list(self._open)
        for writer in writers:
            self._close(writer)
        for writer in writers:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """Status, body and whether the connection may be reused, for one HTTP/1.1 response."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    version, status_text = lines[0].split(b" ", 2)[:2]
    status = int(status_text)
    length: int | None = None
    chunked = False
    keep_alive = version == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"connection":
            keep_alive = value.strip().lower() != b"close"
    if chunked:
        chunks: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return status, b"".join(chunks), keep_alive
            chunks.append((await reader.readexactly(size + 2))[:-2])
    if length is not None:
        return status, await reader.readexactly(length), keep_alive
    if status in (204, 304) or 100 <= status < 200:
        return status, b"", keep_alive
    return status, await reader.read(), False  # body until the server closes


class _HttpxTransport:
    """Requests through a caller-supplied ``httpx.AsyncClient`` (custom TLS, proxies, hooks)."""

    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self._url = url
        self._client = client

    async def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, bytes]:
        import httpx

        try:
            response = await self._client.request(
                method, self._url + path, content=body, headers=headers, timeout=timeout_s
            )
        except httpx.TransportError as exc:
            sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            raise TransportError(f"{type(exc).__name__}: {exc}", sent=sent) from exc
        return response.status_code, response.content

    async def aclose(self) -> None:
        return None  # the caller owns the client


class StoreClient:
    """The store protocol over HTTP (see the module docstring for retry semantics).

    Args:
        url: Base URL of a store server, e.g. ``http://127.0.0.1:4747``.
        token: Bearer token, if the server was started with one.
        timeout_s: Per-request timeout (``wait_for_rollouts`` adds its own wait on top).
        retries: How many times a failed request is retried (connection errors and 5xx only).
        backoff_s: First retry delay; doubles on each retry, capped at 2 s.
        retry_for_s: Keep retrying (every 2 s at most) until a failure has lasted this long, even
            after ``retries`` tries: long enough to outlast a restart of the store server or its
            database (the trainer uses ``TrainerConfig.store_retry_s``). 0: ``retries`` alone decides.
        max_connections: Most requests in flight at once (each holds one keep-alive connection).
        http_client: An ``httpx.AsyncClient`` to use instead of the default one (custom TLS, proxies,
            transports or event hooks). The caller keeps ownership: ``close()`` does not close it.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.05,
        retry_for_s: float = 0.0,
        max_connections: int = 256,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if retries < 0:
            raise InvalidRequestError(f"retries must be >= 0, got {retries}.")
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        if not retry_for_s >= 0:
            raise InvalidRequestError(f"retry_for_s must be >= 0 seconds, got {retry_for_s}.")
        self._retries = retries
        self._backoff_s = backoff_s
        self._retry_for_s = retry_for_s
        self._headers = {"content-type": "application/json"}
        if token and any(c.isspace() for c in token):
            raise InvalidRequestError("the store token must not contain whitespace or line breaks.")
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._transport: _Transport = (
            _HttpxTransport(self.url, http_client)
            if http_client is not None
            else _Http11Pool(self.url, max_connections)
        )

    def __repr__(self) -> str:
        return f"StoreClient({self.url!r})"

    async def __aenter__(self) -> StoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- rollouts ---------------------------------------------------------------------------
    async def enqueue(self, requests: Sequence[RolloutRequest]) -> list[Rollout]:
        body = EnqueueBody.model_construct(requests=list(requests))
        return RolloutList.model_validate_json(await self._call("POST", "/rollouts/enqueue", body)).rollouts

    async def claim(self, worker_id: str, n: int = 1, *, timeout_s: float | None = None) -> list[Claim]:
        """Claim up to ``n`` rollouts. Retried like every call; if a response is lost, the attempts
        it opened are orphaned and the store times them out through their heartbeat deadline (the
        rollout's ``heartbeat_timeout_s`` or the store's default), then requeues them."""
        attempt_timeout(RolloutConfig(), timeout_s)  # JSON has no NaN/inf: check here, not on the server
        body = ClaimBody.model_construct(worker_id=worker_id, n=n, timeout_s=timeout_s)
        return ClaimList.model_validate_json(await self._call("POST", "/rollouts/claim", body)).claims

    async def heartbeat(self, attempt_id: str) -> Attempt:
        return Attempt.model_validate_json(await self._call("POST", f"/attempts/{_q(attempt_id)}/heartbeat", None))

    async def finish_attempt(
        self,
        attempt_id: str,
        status: AttemptStatus,
        *,
        error: str | None = None,
        reward: float | None = None,
    ) -> Rollout:
        check_reward(reward)  # JSON has no NaN/inf: sent, it would arrive as null
        body = FinishBody.model_construct(status=status, error=error, reward=reward)
        path = f"/attempts/{_q(attempt_id)}/finish"
        try:
            return Rollout.model_validate_json(await self._call("POST", path, body, detect_retry=True))
        except _Retried as retried:
            # An earlier try may have landed and its response got lost: if the attempt already has
            # the status we asked for, that try succeeded and this is the answer it would have had.
            attempt = await self.get_attempt(attempt_id)
            if attempt.status == status and attempt.reward == reward:
                return await self.get_rollout(attempt.rollout_id)
            raise retried.__cause__ or IllegalTransitionError(str(retried)) from None

    async def cancel(self, rollout_ids: Sequence[str]) -> list[Rollout]:
        body = IdsBody.model_construct(ids=list(rollout_ids))
        return RolloutList.model_validate_json(await self._call("POST", "/rollouts/cancel", body)).rollouts

    async def get_rollout(self, rollout_id: str) -> Rollout:
        return Rollout.model_validate_json(await self._call("GET", f"/rollouts/{_q(rollout_id)}", None))

    async def query_rollouts(
        self,
        *,
        ids: Sequence[str] | None = None,
        status: Sequence[RolloutStatus] | None = None,
        group_id: str | None = None,
        mode: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[Rollout]:
        body = QueryRolloutsBody.model_construct(
            ids=list(ids) if ids is not None else None,
            status=list(status) if status is not None else None,
            group_id=group_id,
            mode=mode,
            limit=limit,
            offset=offset,
        )
        return RolloutList.model_validate_json(await self._call("POST", "/rollouts/query", body)).rollouts

    async def wait_for_rollouts(self, ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        body = WaitBody.model_construct(ids=list(ids), timeout_s=max(float(timeout_s), 0.0))
        raw = await self._call("POST", "/rollouts/wait", body, timeout_s=self._timeout_s + max(timeout_s, 0.0))
        return RolloutList.model_validate_json(raw).rollouts

    # --- attempts ---------------------------------------------------------------------------
    async def get_attempt(self, attempt_id: str) -> Attempt:
        return Attempt.model_validate_json(await self._call("GET", f"/attempts/{_q(attempt_id)}", None))

    async def query_attempts(self, rollout_id: str) -> list[Attempt]:
        raw = await self._call("GET", f"/rollouts/{_q(rollout_id)}/attempts", None)
        return AttemptList.model_validate_json(raw).attempts

    # --- spans ------------------------------------------------------------------------------
    async def add_spans(self, spans: Sequence[Span]) -> int:
        body = SpansBody.model_construct(spans=list(spans))
        return Count.model_validate_json(await self._call("POST", "/spans", body)).count

    async def query_spans(
        self,
        *,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        name: str | None = None,
        limit: int = 10_000,
        offset: int = 0,
    ) -> list[Span]:
        body = QuerySpansBody.model_construct(
            rollout_id=rollout_id, attempt_id=attempt_id, name=name, limit=limit, offset=offset
        )
        return SpanList.model_validate_json(await self._call("POST", "/spans/query", body)).spans

    # --- resources --------------------------------------------------------------------------
    async def add_resources(
        self,
        *,
        llm: LLMResource | None = None,
        prompts: dict[str, str] | None = None,
        extra: dict[str, object] | None = None,
    ) -> Resources:
        body = ResourcesBody.model_construct(llm=llm, prompts=prompts, extra=extra)
        return Resources.model_validate_json(await self._call("POST", "/resources", body, safe_retry=False))

    async def get_resources(self, version: int | None = None) -> Resources:
        path = "/resources/latest" if version is None else f"/resources/{int(version)}"
        return Resources.model_validate_json(await self._call("GET", path, None))

    # --- housekeeping -----------------------------------------------------------------------
    async def expire(self, now: float | None = None) -> int:
        return Count.model_validate_json(await self._call("POST", "/expire", ExpireBody.model_construct(now=now))).count

    async def prune(self, older_than: float) -> int:
        body = PruneBody.model_construct(older_than=older_than)
        return Count.model_validate_json(await self._call("POST", "/prune", body)).count

    async def stats(self) -> StoreStats:
        return StoreStats.model_validate_json(await self._call("GET", "/stats", None))

    async def health(self) -> bool:
        """Whether the server answers ``/health`` (one try, no retries)."""
        try:
            status, _ = await self._transport.request("GET", "/health", None, self._headers, self._timeout_s)
        except TransportError:
            return False
        return status == 200

    async def close(self) -> None:
        """Close pooled connections (a caller-supplied ``http_client`` is left open)."""
        await self._transport.aclose()

    # --- transport --------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | None,
        *,
        timeout_s: float | None = None,
        safe_retry: bool = True,
        detect_retry: bool = False,
    ) -> bytes:
        """Send one request, retrying transient failures; return the 2xx body or raise.

        ``safe_retry=False`` retries only failures where the request never left (connect errors).
        ``detect_retry=True`` raises ``_Retried`` (chained to the real error) for a 4xx that came
        after an earlier try that may have been applied, so the caller can check what happened.
        """
        # warnings=False: a wrongly typed argument is sent as is and the server answers 400 naming it.
        content = body.model_dump_json(warnings=False).encode() if body is not None else None
        timeout = timeout_s if timeout_s is not None else self._timeout_s
        maybe_applied = False
        delay = self._backoff_s
        started = time.monotonic()
        attempt = 0
        while True:
            # the last try: the retry count is spent and so is the time budget (``retry_for_s``)
            last = attempt >= self._retries and time.monotonic() - started + delay > self._retry_for_s
            try:
                status, raw = await self._transport.request(method, path, content, self._headers, timeout)
            except TransportError as exc:
                if last or not (safe_retry or not exc.sent):
                    raise StoreUnavailableError(
                        f"store server at {self.url} unreachable ({exc}) after {attempt + 1} tries; "
                        "check that `lightning-rl store serve` is running."
                    ) from exc
                maybe_applied = maybe_applied or exc.sent
            else:
                if status < 300:
                    return raw
                error = _error_of(status, raw)
                if status < _RETRY_STATUS_MIN or last or not safe_retry:
                    if detect_retry and maybe_applied and isinstance(error, IllegalTransitionError):
                        raise _Retried(str(error)) from error
                    raise error
                maybe_applied = True
            logger.debug("store request %s %s failed (try %d); retrying in %.2f s", method, path, attempt + 1, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            attempt += 1


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _error_of(status: int, raw: bytes) -> LightningError:
    """The exception a server's error response describes."""
    kind: str | None = None
    message = raw[:2000].decode("utf-8", "replace") or f"HTTP {status}"
    try:
        err = json.loads(raw)["error"]
        kind, message = str(err["type"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        pass
    return error_from_status(status, kind, message)
