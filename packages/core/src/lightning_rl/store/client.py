"""A ``LightningStore`` that talks to a store server over HTTP.

Runners on other machines (or in other processes) use ``StoreClient`` exactly like an in-process
store: every protocol method is one HTTP request to ``lightning-rl store serve``. The client is light
(httpx + pydantic only, no web framework), so agent-side installs can use it.

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
import json
import logging
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, Field

from lightning_rl.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    LightningError,
    StoreUnavailableError,
    error_from_status,
)
from lightning_rl.types import (
    Attempt,
    AttemptStatus,
    Claim,
    LLMResource,
    Resources,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    Span,
    StoreStats,
)

__all__ = [
    "StoreClient",
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


class FinishBody(_Body):
    status: AttemptStatus
    error: str | None = None
    reward: float | None = None


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
_JSON = {"content-type": "application/json"}


class _Retried(Exception):
    """Internal marker: the request failed after at least one earlier try that may have landed."""


class StoreClient:
    """The store protocol over HTTP (see the module docstring for retry semantics).

    Args:
        url: Base URL of a store server, e.g. ``http://127.0.0.1:4747``.
        token: Bearer token, if the server was started with one.
        timeout_s: Per-request timeout (``wait_for_rollouts`` adds its own wait on top).
        retries: How many times a failed request is retried (connection errors and 5xx only).
        backoff_s: First retry delay; doubles on each retry, capped at 2 s.
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
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        if retries < 0:
            raise InvalidRequestError(f"retries must be >= 0, got {retries}.")
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._retries = retries
        self._backoff_s = backoff_s
        self._headers = dict(_JSON)
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._owns_client = http_client is None
        self._http = http_client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=512),
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

    async def claim(self, worker_id: str, n: int = 1) -> list[Claim]:
        body = ClaimBody.model_construct(worker_id=worker_id, n=n)
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
        """Whether the server answers ``/health`` (no retries)."""
        try:
            response = await self._http.get(f"{self.url}/health", headers=self._headers)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    async def close(self) -> None:
        if self._owns_client:
            await self._http.aclose()

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
        url = self.url + path
        timeout = httpx.Timeout(timeout_s) if timeout_s is not None else httpx.USE_CLIENT_DEFAULT
        maybe_applied = False
        delay = self._backoff_s
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                response = await self._http.request(
                    method, url, content=content, headers=self._headers, timeout=timeout
                )
            except httpx.TransportError as exc:
                never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
                if last or not (safe_retry or never_sent):
                    raise StoreUnavailableError(
                        f"store server at {self.url} unreachable ({type(exc).__name__}: {exc}) after "
                        f"{attempt + 1} tries; check that `lightning-rl store serve` is running."
                    ) from exc
                maybe_applied = maybe_applied or not never_sent
            else:
                status = response.status_code
                if status < 300:
                    return response.content
                error = _error_of(response)
                if status < _RETRY_STATUS_MIN or last or not safe_retry:
                    if detect_retry and maybe_applied and isinstance(error, IllegalTransitionError):
                        raise _Retried(str(error)) from error
                    raise error
                maybe_applied = True
            logger.debug("store request %s %s failed (try %d); retrying in %.2f s", method, path, attempt + 1, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")  # pragma: no cover


def _q(segment: str) -> str:
    return quote(segment, safe="")


def _error_of(response: httpx.Response) -> LightningError:
    """The exception a server's error response describes."""
    kind: str | None = None
    message = response.text[:2000] or response.reason_phrase
    try:
        payload = json.loads(response.content)
        err = payload["error"]
        kind, message = str(err["type"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        pass
    return error_from_status(response.status_code, kind, message)
