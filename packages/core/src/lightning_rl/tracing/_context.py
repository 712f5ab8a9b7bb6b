"""The per-rollout context: which rollout attempt the code running *right now* belongs to.

One worker process runs many rollouts at once (asyncio tasks, and threads for sync agents), so
"the current rollout" cannot be a global. It lives in a ``contextvars.ContextVar``: every asyncio
task gets a copy of its parent's context, ``asyncio.to_thread`` and ``loop.run_in_executor`` through
``contextvars.copy_context().run`` carry it into threads, and a rollout started in one task is
invisible to its siblings. Plain ``threading.Thread`` targets do *not* inherit it; wrap them with
:func:`bind_context`.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from lightning_rl.types import Resources, Span, Task

if TYPE_CHECKING:
    from lightning_rl.agent import LLM

__all__ = ["SpanSink", "RolloutContext", "rollout_context", "current_rollout", "bind_context"]

_log = logging.getLogger("lightning_rl.tracing")

SpanSink = Callable[[Span], object]
"""Where a rollout's spans go: any callable taking a span and returning quickly, from any thread
(``SpanWriter.submit`` is the usual one; ``list.append`` works in tests)."""

P = ParamSpec("P")
R = TypeVar("R")


class RolloutContext:
    """What the code of one rollout attempt can see about it.

    Attributes:
        rollout_id: The rollout being run.
        attempt_id: This try of it; spans are attributed to it.
        attempt_number: 1 for the first attempt, 2 for the first retry, ...
        trace_id: The trace id of spans recorded with the built-in tracer (32 hex chars).
        task: The task the agent runs on, when known.
        resources: The resources version the rollout runs with, when known.
        llm: The ``LLM`` handed to the agent, when known.
    """

    __slots__ = (
        "rollout_id",
        "attempt_id",
        "attempt_number",
        "trace_id",
        "task",
        "resources",
        "llm",
        "_sink",
        "_reward",
        "_lock",
        "_spans_recorded",
    )

    def __init__(
        self,
        rollout_id: str,
        attempt_id: str,
        *,
        sink: SpanSink | None = None,
        attempt_number: int = 1,
        trace_id: str | None = None,
        task: Task | None = None,
        resources: Resources | None = None,
        llm: LLM | None = None,
    ) -> None:
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.attempt_number = attempt_number
        self.trace_id = trace_id or uuid.uuid4().hex
        self.task = task
        self.resources = resources
        self.llm = llm
        self._sink = sink
        self._reward: float | None = None
        self._lock = threading.Lock()
        self._spans_recorded = 0

    @property
    def last_reward(self) -> float | None:
        """The value of the last ``emit_reward`` of this attempt (None if it emitted none)."""
        return self._reward

    @property
    def spans_recorded(self) -> int:
        """How many spans this context handed to its sink."""
        return self._spans_recorded

    def set_reward(self, value: float) -> None:
        """Remember ``value`` as the attempt's latest reward (``emit_reward`` calls this)."""
        with self._lock:
            self._reward = value

    def record(self, span: Span) -> None:
        """Hand a finished span to the sink; a failing sink is logged, never raised into the agent."""
        with self._lock:
            self._spans_recorded += 1
        if self._sink is None:
            _log.debug("rollout %s has no span sink; span %r not exported", self.rollout_id, span.name)
            return
        try:
            self._sink(span)
        except Exception:  # instrumentation must never break the agent
            _log.warning("could not export span %r of rollout %s", span.name, self.rollout_id, exc_info=True)

    def __repr__(self) -> str:
        return f"RolloutContext(rollout_id={self.rollout_id!r}, attempt_id={self.attempt_id!r})"


_current: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar("lightning_rollout", default=None)
# The span the built-in tracer nests new spans under; reset when a rollout context is entered so a
# span id never leaks from one rollout into another.
current_span_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("lightning_span", default=None)


def current_rollout() -> RolloutContext | None:
    """The rollout attempt the calling code runs in, or None outside any rollout."""
    return _current.get()


@contextmanager
def rollout_context(
    rollout_id: str | RolloutContext,
    attempt_id: str | None = None,
    *,
    sink: SpanSink | None = None,
    attempt_number: int = 1,
    task: Task | None = None,
    resources: Resources | None = None,
    llm: LLM | None = None,
) -> Generator[RolloutContext]:
    """Make the code inside the ``with`` block (and the tasks and threads it starts) belong to one attempt.

    Pass either an existing ``RolloutContext`` or the ids (plus an optional span ``sink``)::

        with rollout_context("ro-1", "at-1", sink=writer.submit) as ctx:
            reward = agent(task, llm)
    """
    if isinstance(rollout_id, RolloutContext):
        ctx = rollout_id
    else:
        if attempt_id is None:
            raise TypeError("rollout_context(rollout_id, attempt_id, ...) needs the attempt id.")
        ctx = RolloutContext(
            rollout_id,
            attempt_id,
            sink=sink,
            attempt_number=attempt_number,
            task=task,
            resources=resources,
            llm=llm,
        )
    token = _current.set(ctx)
    span_token = current_span_id.set(None)
    try:
        yield ctx
    finally:
        current_span_id.reset(span_token)
        _current.reset(token)


def bind_context(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap ``fn`` so it runs in a copy of the *current* context (rollout and open span included).

    Use it for plain threads, which start with an empty context:
    ``threading.Thread(target=bind_context(work)).start()``. ``asyncio.to_thread`` needs no wrapping.
    """
    ctx = contextvars.copy_context()

    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.copy().run(fn, *args, **kwargs)

    return bound
