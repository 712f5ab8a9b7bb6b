"""Bind a call to a claimed, running attempt before it is served, and check the attempt's key.

A call that names a rollout is recorded into it, and what is recorded is trained on. So before
serving it the gateway checks, against the store, that it names an attempt that exists (else 404:
a mistyped URL would train on nothing), that is still running (else 409: recording fell back to an
ended attempt), and that the call carries that attempt's own key (else 403). The key
(``Attempt.gateway_key``) is minted by the store with the attempt and handed by the runner to the
agent inside its base URL (``…/rollouts/R/attempts/A/key/K/v1``, see
``lightning_rl.agent.rollout_base_url``), so frameworks and plugins carry it without knowing; a
rollout's id alone, which the trainer makes predictable, is no longer enough to write into it.

The store is asked once per attempt (concurrent first calls share the look-up) and the answer kept
for ``ttl_s`` while the attempt runs, for good once it ended: a call may still be served up to
``ttl_s`` after its attempt ended.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable
from dataclasses import replace

from lightning_rl.errors import NotFoundError
from lightning_rl.gateway.protocol import GatewayHTTPError
from lightning_rl.gateway.recording import CallContext
from lightning_rl.store.base import LightningStore
from lightning_rl.types import Attempt, AttemptStatus

__all__ = ["AttemptBinder"]

_MAX_CACHED = 100_000


def _not_found(message: str) -> GatewayHTTPError:
    return GatewayHTTPError(404, message, code="attempt_not_found")


class AttemptBinder:
    """Resolves and checks the attempt of each recorded call against ``store``, trusting a running
    attempt's look-up for ``ttl_s`` (see the module docstring)."""

    def __init__(self, store: LightningStore, ttl_s: float = 1.0) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._attempts: dict[str, tuple[float, Attempt]] = {}  # attempt id -> (checked at, attempt)
        self._running: dict[str, tuple[float, Attempt]] = {}  # rollout id -> its running attempt
        self._pending: dict[str, asyncio.Future[Attempt]] = {}

    def bind(self, ctx: CallContext) -> CallContext | Awaitable[CallContext]:
        """``ctx`` with its attempt id, at once when the attempt's answer is cached, else an awaitable;
        either raises ``GatewayHTTPError`` (404 unknown, 409 ended, 403 wrong key, 503 store down)."""
        assert ctx.rollout_id is not None
        now = time.monotonic()
        cached = self._cached(ctx, now)
        if cached is not None:
            return self._check(ctx, cached)
        return self._bind_slowly(ctx)

    def _cached(self, ctx: CallContext, now: float) -> Attempt | None:
        assert ctx.rollout_id is not None
        entry = self._attempts.get(ctx.attempt_id) if ctx.attempt_id is not None else self._running.get(ctx.rollout_id)
        if entry is None:
            return None
        checked, attempt = entry
        # A running attempt may end, and a rollout named without its attempt may get a new one.
        if (attempt.status is AttemptStatus.RUNNING or ctx.attempt_id is None) and now - checked > self.ttl_s:
            return None
        return attempt

    async def _bind_slowly(self, ctx: CallContext) -> CallContext:
        assert ctx.rollout_id is not None
        lookup = f"a:{ctx.attempt_id}" if ctx.attempt_id is not None else f"r:{ctx.rollout_id}"
        pending = self._pending.get(lookup)
        if pending is None:
            pending = asyncio.ensure_future(self._look_up(ctx))
            self._pending[lookup] = pending
            pending.add_done_callback(lambda _: self._pending.pop(lookup, None))
        attempt = await asyncio.shield(pending)
        return self._check(ctx, attempt)

    async def _look_up(self, ctx: CallContext) -> Attempt:
        assert ctx.rollout_id is not None
        try:
            if ctx.attempt_id is not None:
                attempt = await self.store.get_attempt(ctx.attempt_id)
            else:
                attempt = await self._running_attempt(ctx.rollout_id)
        except NotFoundError as exc:
            what = f"attempt {ctx.attempt_id!r}" if ctx.attempt_id is not None else f"rollout {ctx.rollout_id!r}"
            raise _not_found(
                f"{what} does not exist in the store this gateway records to; use the base URL the runner gave "
                "the agent (LLM.base_url) or a rollout claimed from this store."
            ) from exc
        except GatewayHTTPError:
            raise
        except Exception as exc:  # the store is down: refuse rather than serve a call nobody can record
            raise GatewayHTTPError(
                503,
                f"the store could not be asked about this call's attempt ({type(exc).__name__}); retry shortly.",
                type="service_unavailable",
                code="store_unavailable",
            ) from exc
        self._remember(attempt, time.monotonic())
        return attempt

    async def _running_attempt(self, rollout_id: str) -> Attempt:
        """The running attempt of a rollout named without its attempt (or its latest, to say it ended)."""
        attempts = await self.store.query_attempts(rollout_id)
        if not attempts:
            await self.store.get_rollout(rollout_id)  # raises NotFoundError for an unknown rollout
            raise GatewayHTTPError(
                409,
                f"rollout {rollout_id!r} has no attempt yet (not claimed); calls are recorded into a running attempt.",
                code="attempt_not_running",
            )
        running = [a for a in attempts if a.status is AttemptStatus.RUNNING]
        return running[-1] if running else attempts[-1]

    def _remember(self, attempt: Attempt, now: float) -> None:
        if len(self._attempts) >= _MAX_CACHED:
            self._attempts.clear()
            self._running.clear()
        self._attempts[attempt.id] = (now, attempt)
        self._running[attempt.rollout_id] = (now, attempt)

    def _check(self, ctx: CallContext, attempt: Attempt) -> CallContext:
        if attempt.rollout_id != ctx.rollout_id:
            raise _not_found(f"attempt {attempt.id!r} does not belong to rollout {ctx.rollout_id!r}.")
        expected = attempt.gateway_key
        if expected is not None and not hmac.compare_digest((ctx.key or "").encode(), expected.encode()):
            raise GatewayHTTPError(
                403,
                f"this call names attempt {attempt.id!r} but does not carry its key; send it through the base URL "
                "the runner gave the agent (LLM.base_url, which ends in /key/<key>/v1) or the X-Lightning-Key header.",
                type="permission_error",
                code="attempt_key_mismatch",
            )
        if attempt.status is not AttemptStatus.RUNNING:
            raise GatewayHTTPError(
                409,
                f"attempt {attempt.id!r} of rollout {attempt.rollout_id!r} has ended ({attempt.status.value}); "
                "its calls can no longer be recorded. Calls must come from a running attempt.",
                code="attempt_not_running",
            )
        if ctx.attempt_id == attempt.id:
            return ctx
        return replace(ctx, attempt_id=attempt.id)
