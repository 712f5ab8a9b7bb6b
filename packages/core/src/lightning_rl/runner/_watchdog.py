"""A watchdog that keeps one blocking ``async`` agent from freezing the whole runner.

An ``async`` agent runs on the runner's event loop, next to every other rollout, the heartbeats
and the signal handling. If it calls something synchronous that takes long (``time.sleep``, a
blocking HTTP client, a CPU-bound loop), nothing else runs: the runner's other attempts stop
heartbeating and are timed out by the store, and Ctrl-C is not even read.

The watchdog is a daemon thread. The loop bumps a timestamp a few times a second; when the
timestamp is older than ``block_timeout_s``, the thread looks at the loop thread's stack
(``sys._current_frames``) for the frame of an agent the runner registered. When it finds one it
logs which agent, rollout and source line block the loop and, when the loop runs in the main
thread, interrupts it: it sends the process ``SIGUSR2``, whose handler raises ``AgentBlockedError``
inside the blocking call (a signal interrupts ``time.sleep`` and blocking socket reads, and
reaches pure-Python loops between two bytecodes). The agent's attempt then fails with that error,
and the loop, the heartbeats and the other rollouts go on. An agent that swallows the error and
blocks again is interrupted again after another ``block_timeout_s``.

It never interrupts anything but an agent: a block elsewhere (a library callback, the runner
itself, a host running other work on the loop) is only logged, at info level. ``SIGUSR2`` is
used only when nobody else handles it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["AgentBlockedError", "LoopWatchdog", "AgentFrame"]

_log = logging.getLogger("lightning_rl.runner")

_INTERRUPT = signal.SIGUSR2 if hasattr(signal, "SIGUSR2") else None


class AgentBlockedError(TimeoutError):
    """An ``async`` agent blocked the runner's event loop past ``block_timeout_s``.

    Raised inside the agent's blocking call. Fix the agent: ``await asyncio.sleep`` instead of
    ``time.sleep``, ``await asyncio.to_thread(fn)`` for blocking work, or make it a plain ``def``
    (sync agents run in threads of their own).
    """


@dataclass(frozen=True)
class AgentFrame:
    """What the watchdog knows about a running async agent."""

    agent: str
    rollout_id: str
    attempt_id: str


class LoopWatchdog:
    """Watches ``loop`` from a daemon thread (see the module docstring).

    Args:
        loop: The runner's event loop; ``start`` must be called from its thread.
        block_timeout_s: How long the loop may be blocked before the watchdog acts.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, block_timeout_s: float) -> None:
        if block_timeout_s <= 0:
            raise ValueError(f"block_timeout_s must be positive, got {block_timeout_s}.")
        self.block_timeout_s = block_timeout_s
        self.interrupted = 0
        """How many times an agent was interrupted."""
        self._loop = loop
        self._agents: dict[int, tuple[FrameType, AgentFrame]] = {}
        self._tick = time.monotonic()
        self._tick_every = min(0.1, block_timeout_s / 4)
        self._ticker: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_thread = threading.get_ident()
        self._target: AgentFrame | None = None  # the agent to interrupt, read by the signal handler
        self._message = ""
        self._previous: Any = None
        self._can_interrupt = False

    # --- registration (loop thread) ---------------------------------------------------------
    def watch(self, coro: Any, info: AgentFrame) -> int | None:
        """Register the coroutine of an async agent before it starts (its frame is what the stack
        is searched for); returns the key to ``forget`` it by once it ends."""
        frame: FrameType | None = getattr(coro, "cr_frame", None)
        if frame is None:
            return None
        self._agents[id(frame)] = (frame, info)
        return id(frame)

    def forget(self, key: int | None) -> None:
        if key is not None:
            self._agents.pop(key, None)

    # --- lifecycle (loop thread) ------------------------------------------------------------
    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._can_interrupt = self._install_handler()
        self._tick = time.monotonic()
        self._schedule_tick()
        self._thread = threading.Thread(target=self._watch, name="lightning-runner-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        if self._can_interrupt and _INTERRUPT is not None:
            with contextlib.suppress(ValueError):
                signal.signal(_INTERRUPT, self._previous)
        self._can_interrupt = False

    def _schedule_tick(self) -> None:
        self._tick = time.monotonic()
        if not self._stop.is_set():
            self._ticker = self._loop.call_later(self._tick_every, self._schedule_tick)

    def _install_handler(self) -> bool:
        if _INTERRUPT is None or threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(_INTERRUPT)
        if current not in (signal.SIG_DFL, None):
            _log.info("SIGUSR2 has a handler already: the watchdog will only report blocking agents")
            return False
        self._previous = current
        signal.signal(_INTERRUPT, self._on_signal)
        return True

    # --- the watching thread ----------------------------------------------------------------
    def _watch(self) -> None:
        acted_at = 0.0
        while not self._stop.wait(self._tick_every):
            now = time.monotonic()
            blocked = now - self._tick
            if blocked < self.block_timeout_s or now - acted_at < self.block_timeout_s:
                continue
            acted_at = now
            self._act(blocked)

    def _act(self, blocked_s: float) -> None:
        frame = sys._current_frames().get(self._loop_thread)  # pyright: ignore[reportPrivateUsage]
        if frame is None:
            return
        where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        info = self._agent_on(frame)
        if info is None:
            # Not an agent (e.g. a host that runs other work on this loop): worth knowing, not alarming.
            _log.info("the runner's event loop has been blocked for %.1f s at %s (not in an agent)", blocked_s, where)
            return
        message = (
            f"async agent {info.agent} blocked the runner's event loop for {blocked_s:.1f} s "
            f"(rollout {info.rollout_id}, attempt {info.attempt_id}) at {where}; every other rollout of this "
            "runner was frozen meanwhile. Use `await asyncio.sleep` instead of `time.sleep`, "
            "`await asyncio.to_thread(fn)` for blocking work, or make the agent a plain `def` (run in a thread)."
        )
        if not self._can_interrupt:
            _log.error("%s (cannot interrupt it: the runner's loop is not in the main thread)", message)
            return
        _log.error("%s; interrupting it", message)
        self._target, self._message = info, message
        signal.pthread_kill(self._loop_thread, _INTERRUPT)  # pyright: ignore[reportArgumentType]

    def _agent_on(self, frame: FrameType | None) -> AgentFrame | None:
        while frame is not None:
            found = self._agents.get(id(frame))
            if found is not None and found[0] is frame:
                return found[1]
            frame = frame.f_back
        return None

    # --- the signal handler (loop thread, inside the blocking call) --------------------------
    def _on_signal(self, _signum: int, frame: FrameType | None) -> None:
        target, self._target = self._target, None
        if target is None or self._agent_on(frame) != target:
            return  # the agent returned meanwhile: nothing to interrupt
        self.interrupted += 1
        raise AgentBlockedError(self._message)
