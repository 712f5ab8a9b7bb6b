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

The wire format is written once, here: the request and response bodies (``*Body`` / ``*List``) and
one ``Route`` per protocol method, which is at once the client's method (``StoreClient.enqueue`` is
the enqueue route) and what the server serves (``ROUTES``), so the two sides cannot disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from lightning_rl.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    LightningError,
    StoreUnavailableError,
    error_from_status,
)
from lightning_rl.store._rules import attempt_timeout, check_reward
from lightning_rl.store.base import LightningStore
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
    "Route",
    "ROUTES",
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
P = ParamSpec("P")
R = TypeVar("R")


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


class _Wrapped(_Body):
    """A result sent wrapped in its one field (``{"rollouts": [...]}``)."""


class RolloutList(_Wrapped):
    rollouts: list[Rollout]


class ClaimList(_Wrapped):
    claims: list[Claim]


class AttemptList(_Wrapped):
    attempts: list[Attempt]


class SpanList(_Wrapped):
    spans: list[Span]


class Count(_Wrapped):
    count: int


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _version_segment(version: int | None) -> str:
    return "latest" if version is None else str(int(version))


def _parse_version(raw: str) -> int | None:
    if raw != "latest" and not raw.isdigit():
        raise InvalidRequestError(f"resources version must be a positive integer or 'latest', got {raw!r}.")
    return None if raw == "latest" else int(raw)


ROUTES: list[Route[Any, Any]] = []
"""Every protocol method's route, in ``StoreClient``'s order: the server serves these."""


class Route(Generic[P, R]):
    """A protocol method on the wire: ``method path``, its first argument in the path's ``{id}`` if
    it has one (``segment`` writes and reads it) and the others in ``body``, field by field in
    signature order; the answer is ``result`` (a ``_Wrapped`` one unwrapped). ``field`` is what a
    body over the size limit should send in smaller batches.

    Client side, ``check`` refuses what JSON cannot carry (NaN, infinities) before sending,
    ``safe_retry=False`` retries only what provably never left, and ``recover`` answers a 409 that
    came after a retry (see ``StoreClient._invoke``). A ``long_poll`` waits up to its ``timeout_s``
    argument: the client's timeout grows by as much, and a stopping server answers it at once.
    """

    def __init__(
        self,
        fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
        method: str,
        path: str,
        body: type[_Body] | None,
        result: type[BaseModel],
        field: str = "body",
        *,
        check: Callable[[dict[str, Any]], object] | None = None,
        recover: Callable[[StoreClient, dict[str, Any], LightningError], Awaitable[R]] | None = None,
        safe_retry: bool = True,
        long_poll: bool = False,
        segment: tuple[Callable[[Any], str], Callable[[str], Any]] = (_q, str),
    ) -> None:
        self.name, self.signature = fn.__name__, inspect.signature(fn)
        self.method, self.path, self.body, self.result, self.field = method, path, body, result, field
        self.check, self.recover, self.safe_retry, self.long_poll = check, recover, safe_retry, long_poll
        self.head, _, self.tail = path.partition("{id}")
        self.write_segment, self.read_segment = segment
        params = list(self.signature.parameters.values())[1:]
        self._all = frozenset(q.name for q in params)
        self._positional = [q.name for q in params if q.kind is q.POSITIONAL_OR_KEYWORD]
        self._defaults = {q.name: q.default for q in params if q.default is not q.empty}
        names = [q.name for q in params]
        self.id_param = names.pop(0) if "{id}" in path else None
        self.fields = list(zip(body.model_fields if body is not None else (), names, strict=True))
        self.wrap = next(iter(result.model_fields)) if issubclass(result, _Wrapped) else None

        async def call(client: StoreClient, *args: P.args, **kwargs: P.kwargs) -> R:
            return await client._invoke(self, args, kwargs)  # pyright: ignore[reportPrivateUsage]

        call.__name__, call.__qualname__, call.__doc__ = self.name, f"StoreClient.{self.name}", fn.__doc__
        self.call: Callable[Concatenate[StoreClient, P], CoroutineType[Any, Any, R]] = call
        """The ``StoreClient`` method that sends it."""
        ROUTES.append(self)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A call's arguments by name, defaults filled in: what ``Signature.bind`` gives, for a fraction
        of its cost (the client binds every request: it was about 90 of the client's 850 Python calls per
        rollout in ``benchmarks/store_throughput.py``'s loop, under cProfile). A call this cannot bind
        goes through ``Signature.bind``, which raises the ``TypeError`` Python would."""
        if len(args) <= len(self._positional) and self._all.issuperset(kwargs):
            a = dict(zip(self._positional, args, strict=False))
            if not a.keys() & kwargs.keys():
                a.update(kwargs)
                for name, default in self._defaults.items():
                    a.setdefault(name, default)
                if len(a) == len(self._all):
                    return a
        bound = self.signature.bind(None, *args, **kwargs)
        bound.apply_defaults()
        return dict(list(bound.arguments.items())[1:])

    def request(self, a: dict[str, Any]) -> tuple[str, bytes | None]:
        """Client side: the path and body of a call with (bound) arguments ``a``."""
        path = self.path if self.id_param is None else self.head + self.write_segment(a[self.id_param]) + self.tail
        if self.body is None:
            return path, None
        data: dict[str, Any] = {f: a[p] for f, p in self.fields}
        data = {f: list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v for f, v in data.items()}
        # warnings=False: a wrongly typed argument is sent as is and the server answers 400 naming it.
        return path, self.body.model_construct(**data).model_dump_json(warnings=False).encode()

    def parse(self, raw: bytes) -> R:
        """Client side: the method's result, from the answer's body."""
        result: Any = self.result.model_validate_json(raw)
        return getattr(result, self.wrap) if self.wrap is not None else result

    async def answer(self, store: LightningStore, body: BaseModel | None, params: dict[str, str]) -> bytes:
        """Server side: the method's answer on ``store`` to a request's body and path parameters."""
        args = [] if self.id_param is None else [self.read_segment(params["id"])]
        result = await getattr(store, self.name)(*args, **{p: getattr(body, f) for f, p in self.fields})
        if self.wrap is None:
            return result.model_dump_json().encode()
        if self.result is Count:
            return b'{"count":%d}' % result  # a span batch's answer, without pydantic
        return self.result.model_construct(**{self.wrap: result}).model_dump_json().encode()


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------

_RETRY_STATUS_MIN = 500


class TransportError(ConnectionError):
    """The request did not get a complete HTTP response. ``sent`` is False when it provably never
    reached the server (the connection could not be opened), so even a non-idempotent call may retry."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


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
        self._transport: _Http11Pool | _HttpxTransport = (
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

    async def _finished(self, a: dict[str, Any], error: LightningError) -> Rollout:
        # A retried finish got a 409: an earlier try may have landed and its response got lost. If the
        # attempt already has the status we asked for, that try succeeded and this is its answer.
        attempt = await self.get_attempt(a["attempt_id"])
        if attempt.status == a["status"] and attempt.reward == a["reward"]:
            return await self.get_rollout(attempt.rollout_id)
        raise error from None

    # --- the protocol: one route per method (``ROUTES``, which the server serves) ---------------
    # ``check``: JSON has no NaN/inf, so what the server would refuse must be refused here.
    enqueue = Route(LightningStore.enqueue, "POST", "/rollouts/enqueue", EnqueueBody, RolloutList, "requests").call
    claim = Route(
        LightningStore.claim,
        "POST",
        "/rollouts/claim",
        ClaimBody,
        ClaimList,
        check=lambda a: attempt_timeout(RolloutConfig(), a["timeout_s"]),
    ).call
    heartbeat = Route(LightningStore.heartbeat, "POST", "/attempts/{id}/heartbeat", None, Attempt).call
    finish_attempt = Route(
        LightningStore.finish_attempt,
        "POST",
        "/attempts/{id}/finish",
        FinishBody,
        Rollout,
        check=lambda a: check_reward(a["reward"]),
        recover=_finished,
    ).call
    cancel = Route(LightningStore.cancel, "POST", "/rollouts/cancel", IdsBody, RolloutList, "ids").call
    get_rollout = Route(LightningStore.get_rollout, "GET", "/rollouts/{id}", None, Rollout).call
    query_rollouts = Route(
        LightningStore.query_rollouts, "POST", "/rollouts/query", QueryRolloutsBody, RolloutList, "ids"
    ).call
    wait_for_rollouts = Route(
        LightningStore.wait_for_rollouts, "POST", "/rollouts/wait", WaitBody, RolloutList, "ids", long_poll=True
    ).call
    get_attempt = Route(LightningStore.get_attempt, "GET", "/attempts/{id}", None, Attempt).call
    query_attempts = Route(LightningStore.query_attempts, "GET", "/rollouts/{id}/attempts", None, AttemptList).call
    add_spans = Route(LightningStore.add_spans, "POST", "/spans", SpansBody, Count, "spans").call
    query_spans = Route(LightningStore.query_spans, "POST", "/spans/query", QuerySpansBody, SpanList).call
    add_resources = Route(
        LightningStore.add_resources, "POST", "/resources", ResourcesBody, Resources, "extra", safe_retry=False
    ).call
    get_resources = Route(
        LightningStore.get_resources,
        "GET",
        "/resources/{id}",
        None,
        Resources,
        segment=(_version_segment, _parse_version),
    ).call
    expire = Route(LightningStore.expire, "POST", "/expire", ExpireBody, Count).call
    prune = Route(LightningStore.prune, "POST", "/prune", PruneBody, Count).call
    stats = Route(LightningStore.stats, "GET", "/stats", None, StoreStats).call

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
    async def _invoke(self, route: Route[Any, R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
        """Call ``route`` with these arguments: one request, transient failures retried; the result or
        the error the server answered with (see ``Route`` for what its options change)."""
        a = route.bind(args, kwargs)
        if route.check is not None:
            route.check(a)
        timeout = self._timeout_s
        if route.long_poll:
            a["timeout_s"] = max(float(a["timeout_s"]), 0.0)
            timeout += a["timeout_s"]
        method, (path, content) = route.method, route.request(a)
        maybe_applied = False  # an earlier try may have been applied
        delay = self._backoff_s
        started = time.monotonic()
        attempt = 0
        while True:
            # the last try: the retry count is spent and so is the time budget (``retry_for_s``)
            last = attempt >= self._retries and time.monotonic() - started + delay > self._retry_for_s
            try:
                status, raw = await self._transport.request(method, path, content, self._headers, timeout)
            except TransportError as exc:
                if last or not (route.safe_retry or not exc.sent):
                    raise StoreUnavailableError(
                        f"store server at {self.url} unreachable ({exc}) after {attempt + 1} tries; "
                        "check that `lightning-rl store serve` is running."
                    ) from exc
                maybe_applied = maybe_applied or exc.sent
            else:
                if status < 300:
                    return route.parse(raw)
                error = _error_of(status, raw)
                if status < _RETRY_STATUS_MIN or last or not route.safe_retry:
                    if route.recover is not None and maybe_applied and isinstance(error, IllegalTransitionError):
                        return await route.recover(self, a, error)
                    raise error
                maybe_applied = True
            logger.debug("store request %s %s failed (try %d); retrying in %.2f s", method, path, attempt + 1, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
            attempt += 1


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
