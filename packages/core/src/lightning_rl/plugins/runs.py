"""What a plugin remembers between a framework's "started" and "ended" events, bounded.

Frameworks report a tool run (or a model call) twice: when it starts (name, arguments, the role
running it) and when it ends (the output or the error). The tool span needs both, so the plugin
keeps the start until the end arrives, keyed by whatever the framework pairs them with (LangChain's
``run_id``, the model's tool-call id in AutoGen). A run that never ends (a cancelled task, a
framework bug) must not grow the process without bound: :class:`Bounded` forgets its oldest entries
past a limit, and :class:`ToolRuns` builds on it to turn each end into one ``tool`` span.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from lightning_rl.plugins.record import record_tool
from lightning_rl.types import Span

__all__ = ["Bounded", "ToolRun", "ToolRuns"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """A thread-safe dict that forgets its least recently put entries past ``limit``."""

    def __init__(self, limit: int = 10_000) -> None:
        self._data: OrderedDict[K, V] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._limit:
                self._data.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._data.pop(key, None)

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._data.get(key)

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True)
class ToolRun:
    """A tool run that started: what its span will say."""

    name: str
    call_id: str | None
    role: str | None
    arguments: object
    start_ns: int


class ToolRuns(Generic[K]):
    """Tool runs started and not ended yet, by the framework's key; :meth:`end` records the span."""

    def __init__(self, limit: int = 10_000) -> None:
        self._runs: Bounded[K, ToolRun] = Bounded(limit)

    def start(
        self, key: K, name: str, *, call_id: str | None = None, role: str | None = None, arguments: object = None
    ) -> None:
        """Remember that the tool ``name`` started now."""
        self._runs.put(key, ToolRun(name, call_id, role, arguments, time.time_ns()))

    def pop(self, key: K) -> ToolRun | None:
        """The started run of ``key``, forgotten (None: never started, or already ended)."""
        return self._runs.pop(key)

    def end(
        self,
        run: ToolRun,
        *,
        error: BaseException | str | None = None,
        output: object = None,
        call_id: str | None = None,
    ) -> Span | None:
        """Record ``run`` (from :meth:`pop`) as ended with ``output`` or ``error``; ``call_id`` fills in
        an id the start did not know."""
        return record_tool(
            run.name,
            call_id=run.call_id or call_id,
            role=run.role,
            error=error,
            arguments=run.arguments,
            output=output,
            start_ns=run.start_ns,
        )
