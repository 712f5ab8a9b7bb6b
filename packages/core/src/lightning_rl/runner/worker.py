"""The runner: claims rollouts from the store and runs the agent on them, many at a time.

One ``Runner`` is one worker: an asyncio loop holding up to ``concurrency`` rollouts at once. For
each claimed rollout it builds the attempt's ``LLM`` from the rollout's resources version, runs the
agent inside a ``rollout_context`` with the rollout's timeout, heartbeats while it runs, flushes the
attempt's spans, and reports the outcome. The trainer runs it in-process; ``lightning-rl runner``
runs it in worker processes.

Failure handling, which is the point of this module:

* An agent that raises ends its attempt ``failed`` with the last lines of the traceback.
* An ``async`` agent past its timeout is cancelled and its attempt ends ``timed_out``.
* An ``async`` agent that blocks the event loop (``time.sleep``, a blocking client) would freeze
  every other rollout of the runner; a watchdog thread interrupts it after ``block_timeout_s`` with
  ``AgentBlockedError`` naming the agent and the blocking line, so only its own attempt fails
  (see ``lightning_rl.runner._watchdog``).
* A *sync* agent runs in its own daemon thread (with the rollout context copied in). Python cannot
  kill a thread, so a sync agent past its timeout is **abandoned**: the attempt ends ``timed_out``,
  the thread runs on until it returns by itself (its result is ignored) and is counted in
  ``RunnerStats.abandoned_threads``. A process whose sync agents hang often should be restarted;
  ``lightning-rl runner --workers P`` restarts crashed worker processes.
* If the store already ended the attempt (it timed it out, or it was cancelled), a heartbeat or the
  final report is refused; the runner logs it, cancels the agent if it is still running, and goes on.
* A worker process that dies mid-rollout stops heartbeating; the store times the attempt out
  (``heartbeat_timeout_s``, or the store's default when the config sets none) and requeues the
  rollout for another worker. Nothing here is needed for that, except to heartbeat often enough,
  which the runner derives from the rollout's config, and to send its own ``default_timeout_s``
  with each claim so the store enforces it as the attempt's deadline.

None of these stop the runner: only ``stop_event`` (or ``until_idle``) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from lightning_rl import semconv
from lightning_rl.agent import LLM, AgentFn, is_async_agent
from lightning_rl.credentials import redact
from lightning_rl.errors import IllegalTransitionError, NotFoundError, StoreUnavailableError
from lightning_rl.runner._watchdog import AgentBlockedError, AgentFrame, LoopWatchdog
from lightning_rl.spans import SpanWriter
from lightning_rl.store.base import DEFAULT_HEARTBEAT_TIMEOUT_S, LightningStore
from lightning_rl.tracing import RolloutContext, emit_span, rollout_context, span
from lightning_rl.tracing._tracer import as_reward
from lightning_rl.types import AttemptStatus, Claim, Resources, Rollout

__all__ = ["Runner", "RunnerStats", "AgentBlockedError", "default_worker_id"]

_log = logging.getLogger("lightning_rl.runner")

"""The runner's root span around one agent call (status, exception, duration of the attempt).
Proposed for ``lightning_rl.semconv``; defined here until it lands there."""

_ERROR_TAIL_LINES = 12
_ERROR_MAX_CHARS = 4000


def default_worker_id() -> str:
    """``host-pid-xxxx``: unique per process, readable in the store's attempt records."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"


@dataclass
class RunnerStats:
    """What one runner did. Outcomes are as the runner saw them; the store's records are the truth
    (a finish the store refused is counted in ``rejected`` as well as in its outcome)."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    lost: int = 0
    """Attempts the store ended while the agent still ran other than by timing them out (e.g. the
    rollout was cancelled); the agent was cancelled. Store timeouts count in ``timed_out``."""
    rejected: int = 0
    """Final reports the store refused because it had already ended the attempt."""
    store_errors: int = 0
    """Store calls that failed (claims, heartbeats or reports) after retries."""
    abandoned_threads: int = 0
    """Sync agent threads still running after their attempt timed out (cannot be killed)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class _Outcome:
    status: AttemptStatus | None  # None: the store already ended the attempt; report nothing
    reward: float | None = None
    error: str | None = None


def _error_tail(exc: BaseException) -> str:
    """The last lines of a traceback: enough to see what failed without storing megabytes."""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    text = "\n".join(lines[-_ERROR_TAIL_LINES:])
    return text[-_ERROR_MAX_CHARS:]


class _ThreadCall:
    """Runs a sync agent in a daemon thread; the result lands on an asyncio future on the loop."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Any] = loop.create_future()
        self._loop = loop
        context = contextvars.copy_context()  # the rollout context and the root span travel with it

        def target() -> None:
            try:
                result = context.run(fn)
            except BaseException as exc:  # noqa: BLE001 - everything the agent raises is its failure
                self._deliver(None, exc)
            else:
                self._deliver(result, None)

        self.thread = threading.Thread(target=target, name=name, daemon=True)
        self.thread.start()

    def _deliver(self, result: Any, exc: BaseException | None) -> None:
        def settle() -> None:
            if self.future.done():
                return  # timed out or cancelled meanwhile: the result is ignored
            if exc is not None:
                self.future.set_exception(exc)
            else:
                self.future.set_result(result)

        with contextlib.suppress(RuntimeError):  # the loop is closed: the runner is gone, nobody listens
            self._loop.call_soon_threadsafe(settle)


class Runner:
    """Claims rollouts from ``store`` and runs ``agent`` on them, ``concurrency`` at a time.

    Args:
        store: Any ``LightningStore`` (memory, SQLite, PostgreSQL, HTTP client).
        agent: ``agent(task_input, llm) -> float | None``, sync or async (see ``lightning_rl.agent``).
        worker_id: This worker's name in the store (default ``host-pid-xxxx``).
        concurrency: Most rollouts run at once by this runner.
        poll_interval_s: How long to wait before claiming again when the queue was empty.
        heartbeat_interval_s: Longest time between heartbeats of a running attempt (shortened to a
            third of a rollout's ``heartbeat_timeout_s`` when that is smaller).
        default_timeout_s: Timeout for rollouts whose config sets none (None: no limit).
        span_writer: Where spans go; by default the runner creates a ``SpanWriter`` on the store and
            closes it when ``run`` returns. A writer passed in is flushed but not closed.
        flush_timeout_s: How long to wait for an attempt's spans to reach the store before reporting it.
        block_timeout_s: How long an async agent may block the event loop before the watchdog
            interrupts it with ``AgentBlockedError`` (None: no watchdog). Must stay well under the
            heartbeat timeout, or the runner's other attempts are declared lost meanwhile. The default
            (30 s, half the default heartbeat timeout) leaves room for a slow first import on a loaded
            machine: at 10 s the watchdog interrupted agents stuck in ``ssl.create_default_context``.
        redact_errors: Replace what looks like keys, tokens or passwords in the error text stored
            for a failed attempt: True for ``lightning_rl.credentials.DEFAULT_SECRET_PATTERN``, or
            a regular expression of your own.
    """

    def __init__(
        self,
        store: LightningStore,
        agent: AgentFn,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        poll_interval_s: float = 0.5,
        heartbeat_interval_s: float = 5.0,
        default_timeout_s: float | None = None,
        span_writer: SpanWriter | None = None,
        flush_timeout_s: float = 10.0,
        block_timeout_s: float | None = 30.0,
        redact_errors: bool | str = False,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}.")
        if poll_interval_s <= 0 or heartbeat_interval_s <= 0:
            raise ValueError("poll_interval_s and heartbeat_interval_s must be positive.")
        if default_timeout_s is not None and default_timeout_s <= 0:
            raise ValueError(f"default_timeout_s must be positive or None, got {default_timeout_s}.")
        if block_timeout_s is not None and block_timeout_s <= 0:
            raise ValueError(f"block_timeout_s must be positive or None, got {block_timeout_s}.")
        if not callable(agent):
            raise TypeError(f"agent must be callable as agent(task, llm), got {type(agent).__name__}.")
        self.store = store
        self.agent = agent
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.poll_interval_s = poll_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.default_timeout_s = default_timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.block_timeout_s = block_timeout_s
        self.redact_errors = redact_errors
        self.stats = RunnerStats()
        self._watchdog: LoopWatchdog | None = None
        self._writer = span_writer
        self._owns_writer = span_writer is None
        self._is_async = is_async_agent(agent)
        self._resources: dict[int, Resources] = {}
        self._threads: list[threading.Thread] = []

    # --- the claim loop ---------------------------------------------------------------------
    async def run(self, stop_event: asyncio.Event | None = None, *, until_idle: bool = False) -> RunnerStats:
        """Claim and run rollouts until ``stop_event`` is set (or, with ``until_idle``, until the queue
        is empty and nothing is running). Rollouts already running are finished before it returns;
        cancelling ``run`` abandons them instead (the store times them out through missed heartbeats).
        """
        if stop_event is None and not until_idle:
            raise ValueError("Runner.run needs a stop_event or until_idle=True, or it would never return.")
        stop = stop_event or asyncio.Event()
        writer = self._writer = self._writer or SpanWriter(self.store)
        active: set[asyncio.Task[None]] = set()
        _log.info("runner %s started (concurrency %d)", self.worker_id, self.concurrency)
        if self._is_async and self.block_timeout_s is not None and self._watchdog is None:
            self._watchdog = LoopWatchdog(asyncio.get_running_loop(), self.block_timeout_s)
            self._watchdog.start()
        try:
            while not stop.is_set():
                claims = await self._claim(self.concurrency - len(active))
                for claim in claims:
                    task = asyncio.create_task(self._run_claim(claim, writer), name=f"rollout-{claim.rollout.id}")
                    active.add(task)
                    task.add_done_callback(self._task_done(active))
                if claims and len(active) < self.concurrency:
                    continue  # the queue may hold more: claim again right away
                if not claims and not active and until_idle:
                    break
                # Wait for a rollout to finish (a free slot), for new work (poll), or for the stop signal.
                await self._wait(active, full=len(active) >= self.concurrency, stop=stop)
            if active:
                await asyncio.wait(active)
        except asyncio.CancelledError:
            for task in active:
                task.cancel()
            await asyncio.gather(*active, return_exceptions=True)
            raise
        finally:
            if self._watchdog is not None:
                self._watchdog.stop()
                self._watchdog = None
            self.stats.abandoned_threads = sum(t.is_alive() for t in self._threads)
            if self._owns_writer:
                await writer.close(self.flush_timeout_s)
                self._writer = None
        _log.info("runner %s stopped: %s", self.worker_id, self.stats.as_dict())
        return self.stats

    def _task_done(self, active: set[asyncio.Task[None]]) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            active.discard(task)
            if not task.cancelled() and task.exception() is not None:  # a bug in the runner itself
                _log.error("rollout task %s crashed", task.get_name(), exc_info=task.exception())

        return done

    async def _claim(self, free: int) -> list[Claim]:
        if free <= 0:
            return []
        try:
            # The runner's own timeout travels with the claim, so the store enforces it too (a worker
            # killed mid-rollout cannot enforce anything).
            return await self.store.claim(self.worker_id, n=free, timeout_s=self.default_timeout_s)
        except Exception as exc:
            self.stats.store_errors += 1
            _log.warning(
                "runner %s could not claim rollouts (%s); retrying in %.1f s", self.worker_id, exc, self.poll_interval_s
            )
            return []

    async def _wait(self, active: set[asyncio.Task[None]], *, full: bool, stop: asyncio.Event) -> None:
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait(
                {stopper, *active},
                timeout=None if full else self.poll_interval_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            stopper.cancel()

    # --- one rollout ------------------------------------------------------------------------
    async def _run_claim(self, claim: Claim, writer: SpanWriter) -> None:
        claimed_at = time.monotonic()
        rollout, attempt = claim.rollout, claim.attempt
        self.stats.claimed += 1
        try:
            prepared = await self._prepare(rollout, attempt.id, attempt.gateway_key)
            if isinstance(prepared, str):
                self.stats.failed += 1
                await self._report(attempt.id, _Outcome(AttemptStatus.FAILED, error=prepared))
                return
            resources, llm = prepared
            ctx = RolloutContext(
                rollout.id,
                attempt.id,
                sink=writer.submit,
                attempt_number=attempt.number,
                task=rollout.task,
                resources=resources,
                llm=llm,
            )
            outcome = await self._execute(ctx, rollout, llm, claimed_at)
        except Exception as exc:  # a bug here must cost one attempt, not the runner
            _log.exception("runner error on attempt %s", attempt.id)
            self.stats.failed += 1
            outcome = _Outcome(AttemptStatus.FAILED, error=f"runner error: {_error_tail(exc)}")
        # Spans first: once the attempt is reported, the trainer may read them.
        if not await writer.flush(self.flush_timeout_s):
            _log.warning(
                "spans of attempt %s did not all reach the store within %.1f s", attempt.id, self.flush_timeout_s
            )
        await self._report(attempt.id, outcome)

    async def _prepare(self, rollout: Rollout, attempt_id: str, key: str | None) -> tuple[Resources, LLM] | str:
        """The rollout's resources and the attempt's LLM, or an error message saying why it cannot run."""
        try:
            resources = await self._get_resources(rollout)
        except Exception as exc:
            return f"could not load the rollout's resources: {exc}"
        if resources.llm is None:
            return (
                f"resources version {resources.version} has no llm; publish resources with an LLMResource "
                "(store.add_resources(llm=...)) before enqueueing rollouts."
            )
        llm = LLM.for_attempt(resources.llm, rollout.id, attempt_id, resources_version=resources.version, key=key)
        return resources, llm

    async def _get_resources(self, rollout: Rollout) -> Resources:
        version = rollout.resources_version
        if version is not None and version in self._resources:
            return self._resources[version]
        resources = await self.store.get_resources(version)
        self._resources[resources.version] = resources  # versions are immutable: safe to cache
        return resources

    async def _execute(self, ctx: RolloutContext, rollout: Rollout, llm: LLM, claimed_at: float) -> _Outcome:
        """Run the agent in the rollout's context, with its timeout and a heartbeat."""
        timeout = rollout.config.timeout_s or self.default_timeout_s
        # The store counts the timeout from the claim; so do we, so both sides agree on when it ends.
        remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - claimed_at))
        with (
            rollout_context(ctx),
            span(
                semconv.SPAN_ROLLOUT, **{semconv.ROLLOUT_ID: ctx.rollout_id, semconv.ATTEMPT_ID: ctx.attempt_id}
            ) as root,
        ):
            future, thread = self._start_agent(rollout.task.input, llm, rollout.id, ctx.attempt_id)
            lost = asyncio.Event()
            beat = asyncio.create_task(self._heartbeat(ctx.attempt_id, rollout, future, lost))
            try:
                done, _ = await asyncio.wait({future}, timeout=remaining)
            except asyncio.CancelledError:
                future.cancel()
                raise
            finally:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

            if not done:
                message = f"agent ran past the rollout timeout of {timeout or 0:g} s"
                if thread is not None:
                    message += " (sync agent thread abandoned: it cannot be killed)"
                    self._threads.append(thread)
                    self.stats.abandoned_threads = sum(t.is_alive() for t in self._threads)
                await self._cancel(future)
                self.stats.timed_out += 1
                root.set_status("error", message)
                return _Outcome(AttemptStatus.TIMED_OUT, error=message)
            if lost.is_set() or future.cancelled():
                if thread is not None and thread.is_alive():
                    self._threads.append(thread)
                await self._count_lost(ctx.attempt_id)
                root.set_status("error", "the store ended the attempt while the agent ran")
                return _Outcome(None)
            exc = future.exception()
            if exc is not None:
                self.stats.failed += 1
                root.record_exception(exc)
                return _Outcome(AttemptStatus.FAILED, error=_error_tail(exc))
            try:
                returned = future.result()
                reward = as_reward(returned, "the agent's return value") if returned is not None else ctx.last_reward
            except (TypeError, ValueError) as bad:
                self.stats.failed += 1
                root.record_exception(bad)
                return _Outcome(AttemptStatus.FAILED, error=f"{bad} Return a float reward or None.")
            if returned is not None and reward != ctx.last_reward:
                emit_span(semconv.SPAN_REWARD, {semconv.REWARD_VALUE: reward})  # the returned reward is final
            self.stats.succeeded += 1
            root.set_status("ok")
            return _Outcome(AttemptStatus.SUCCEEDED, reward=reward)

    async def _count_lost(self, attempt_id: str) -> None:
        """Count an attempt the store ended under us: as timed out if that is what the store decided."""
        try:
            ended = await self.store.get_attempt(attempt_id)
        except Exception:
            ended = None
        if ended is not None and ended.status is AttemptStatus.TIMED_OUT:
            self.stats.timed_out += 1
        else:
            self.stats.lost += 1

    def _start_agent(
        self, task_input: Any, llm: LLM, rollout_id: str, attempt_id: str
    ) -> tuple[asyncio.Future[Any], threading.Thread | None]:
        """Start the agent in the current (rollout) context: a task for async agents, a thread for sync ones."""
        name = f"lightning-agent-{rollout_id}"
        if self._is_async:
            try:
                coro: Any = self.agent(task_input, llm)
                future = asyncio.ensure_future(coro)
                watchdog = self._watchdog
                if watchdog is not None:
                    agent_name = getattr(self.agent, "__qualname__", type(self.agent).__qualname__)
                    key = watchdog.watch(coro, AgentFrame(agent_name, rollout_id, attempt_id))
                    future.add_done_callback(lambda _f: watchdog.forget(key))  # pyright: ignore[reportUnknownLambdaType]
                return future, None
            except Exception as exc:  # e.g. a wrong signature: the attempt fails, the runner goes on
                failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                failed.set_exception(exc)
                return failed, None

        def call() -> Any:
            result = self.agent(task_input, llm)
            if inspect.iscoroutine(result):  # a sync callable that returned a coroutine: run it here
                result = asyncio.run(result)
            return result

        runner = _ThreadCall(call, name=name)
        return runner.future, runner.thread

    @staticmethod
    async def _cancel(future: asyncio.Future[Any]) -> None:
        """Cancel an agent that overran; give an async one a moment to unwind, then leave it."""
        if future.done():
            return
        future.cancel()
        if isinstance(future, asyncio.Task):
            await asyncio.wait({future}, timeout=1.0)
            if not future.done():
                _log.warning("agent task %s ignored its cancellation; abandoning it", future.get_name())

    async def _heartbeat(
        self, attempt_id: str, rollout: Rollout, future: asyncio.Future[Any], lost: asyncio.Event
    ) -> None:
        interval = self.heartbeat_interval_s
        heartbeat_timeout = rollout.config.heartbeat_timeout_s or DEFAULT_HEARTBEAT_TIMEOUT_S
        interval = min(interval, heartbeat_timeout / 3)
        while not future.done():
            await asyncio.sleep(interval)
            try:
                await self.store.heartbeat(attempt_id)
            except (IllegalTransitionError, NotFoundError) as exc:
                _log.warning("attempt %s was ended by the store (%s); cancelling its agent", attempt_id, exc)
                lost.set()
                await self._cancel(future)
                return
            except Exception as exc:
                self.stats.store_errors += 1
                _log.warning("heartbeat of attempt %s failed (%s); will retry", attempt_id, exc)

    async def _report(self, attempt_id: str, outcome: _Outcome) -> None:
        """Tell the store how the attempt ended; a refusal because it already ended it is only logged."""
        status = outcome.status
        if status is None:
            return
        if self.redact_errors and outcome.error is not None:
            pattern = None if self.redact_errors is True else self.redact_errors
            outcome = _Outcome(status, outcome.reward, redact(outcome.error, pattern or None))
        delay = 0.2
        last: Exception | None = None
        for tries_left in range(3, 0, -1):
            try:
                await self.store.finish_attempt(attempt_id, status, error=outcome.error, reward=outcome.reward)
                return
            except (IllegalTransitionError, NotFoundError) as exc:
                self.stats.rejected += 1
                _log.info("store refused to end attempt %s as %s: %s", attempt_id, status.value, exc)
                return
            except (StoreUnavailableError, ConnectionError, OSError, TimeoutError) as exc:
                last = exc
                if tries_left > 1:
                    _log.warning("could not report attempt %s (%s); retrying in %.1f s", attempt_id, exc, delay)
                    await asyncio.sleep(delay)
                    delay *= 2
            except Exception as exc:
                last = exc
                break
        self.stats.store_errors += 1
        _log.error(
            "could not report attempt %s as %s (%s); the store will time it out through its heartbeat rule",
            attempt_id,
            status.value,
            last,
        )
