"""A KV cache that grows in place: spare columns reserved on the right, a fixed step more when they run out.

transformers' ``DynamicLayer`` appends a decode step's keys and values with ``torch.cat``, which copies
the whole cache on every step: with the demo's 128 rows that ``cat`` was 13% of a decode step (and
the attention's per-head copy another 25%, see ``_attention``; ``benchmarks/engine_decode_step.py
--profile``). Here each layer's keys and values live in a buffer with room for more columns; a
step writes its column in place and the layer exposes a view of the filled window, so a step copies
one column, and a full copy happens only when the room runs out: the buffer then grows to the next
multiple of ``MIN_CAPACITY`` columns. Growth by a fixed step, not by doubling, because memory is what
the room costs: doubling leaves up to half of every buffer empty (a 330-token SmolLM2 prompt
reserved 512 columns, and 64 such rows of a float32 cache are ~1.5 GB), a fixed step at most
``MIN_CAPACITY`` columns per row. The extra copies are cheap beside attention itself: one copy of
the window every ``MIN_CAPACITY`` steps, where every step's attention already reads the whole
window twice (keys and values).

The same structure holds the batch's attention mask (``ColumnBuffer`` over dim 1), and the two
operations of continuous batching work on the window only: ``keep`` copies the rows that stay (and
drops columns that became padding for all of them) into a fresh buffer in one ``index_select``;
``stack`` left-pads two windows to a common width and stacks their rows. Padding columns are zeros,
as ``DynamicLayer``'s, so attention over them (masked) never meets uninitialised memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

__all__ = ["ColumnBuffer", "GrowingCache", "GrowingLayer", "capacity_for", "release"]

MIN_CAPACITY = 64
"""Fewest columns a buffer reserves, and the step it grows by (the demo's answers are ~15 tokens)."""


def capacity_for(columns: int) -> int:
    """Columns to reserve for ``columns``: the next multiple of ``MIN_CAPACITY`` (at least one)."""
    return MIN_CAPACITY * max(1, -(-columns // MIN_CAPACITY))


class ColumnBuffer:
    """A tensor whose ``dim`` (its columns) grows in place; row ``i`` is index ``i`` of dim 0.

    ``data`` is the filled window ``[start, end)`` of a buffer with ``capacity`` columns; ``append``
    writes after ``end``, ``keep`` moves the window's kept rows into a new buffer.
    """

    def __init__(self, data: torch.Tensor, dim: int, *, rows: torch.Tensor | None = None, room: int = 1) -> None:
        self.dim = dim
        self._buffer = data  # replaced below
        self._start = 0
        self._end = 0
        if rows is None:
            self._adopt(data, room)
        else:  # an empty buffer, then the selected rows
            self._buffer = data.narrow(0, 0, 0)
            self.stack(data, rows)

    @property
    def data(self) -> torch.Tensor:
        return self._buffer.narrow(self.dim, self._start, self._end - self._start)

    @property
    def capacity(self) -> int:
        return int(self._buffer.shape[self.dim])

    @property
    def columns(self) -> int:
        return self._end - self._start

    def _fresh(self, template: torch.Tensor, rows: int, columns: int, *, zeros: bool = False) -> torch.Tensor:
        shape = list(template.shape)
        shape[0], shape[self.dim] = rows, capacity_for(columns)
        return template.new_zeros(shape) if zeros else template.new_empty(shape)

    def _adopt(self, data: torch.Tensor, room: int) -> None:
        """Copy ``data`` into a new buffer with at least ``room`` spare columns."""
        columns = int(data.shape[self.dim])
        buffer = self._fresh(data, int(data.shape[0]), columns + room)
        buffer.narrow(self.dim, 0, columns).copy_(data)
        self._buffer, self._start, self._end = buffer, 0, columns

    def append(self, columns: torch.Tensor) -> torch.Tensor:
        """Write ``columns`` after the window (same rows) and return the grown window."""
        count = int(columns.shape[self.dim])
        if self._end + count > self.capacity:
            self._adopt(self.data, count)
        self._buffer.narrow(self.dim, self._end, count).copy_(columns)
        self._end += count
        return self.data

    def keep(self, rows: torch.Tensor, drop_left: int = 0) -> None:
        """Keep ``rows`` (a LongTensor of row indices, in that order) and drop the first ``drop_left``
        columns, in one copy into a new buffer that keeps the current spare room."""
        window = self.data.narrow(self.dim, drop_left, self.columns - drop_left)
        columns = int(window.shape[self.dim])
        buffer = self._fresh(window, int(rows.shape[0]), max(columns + 1, self.capacity - drop_left))
        torch.index_select(window, 0, rows, out=buffer.narrow(self.dim, 0, columns))
        self._buffer, self._start, self._end = buffer, 0, columns

    def stack(self, other: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        """Append ``other``'s rows (or its rows ``rows``, repeats allowed) after these, both
        right-aligned (left-padded with zeros) to the wider of the two windows."""
        mine = self.data
        width_other = int(other.shape[self.dim])
        width = max(self.columns, width_other)
        count = int(mine.shape[0])
        added = int(other.shape[0]) if rows is None else int(rows.shape[0])
        padded = (count > 0 and self.columns < width) or width_other < width
        buffer = self._fresh(mine, count + added, width + 1, zeros=padded)
        buffer.narrow(0, 0, count).narrow(self.dim, width - self.columns, self.columns).copy_(mine)
        target = buffer.narrow(0, count, added).narrow(self.dim, width - width_other, width_other)
        if rows is None:
            target.copy_(other)
        else:
            torch.index_select(other, 0, rows, out=target)
        self._buffer, self._start, self._end = buffer, 0, width


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose keys and values grow in place (``[B, heads, L, head_dim]``).

    ``keys`` and ``values`` are views of the filled window, as transformers reads them; the batch
    changes rows and columns only through ``keep`` and ``stack``.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._keys = ColumnBuffer(keys, 2, rows=rows)
        self._values = ColumnBuffer(values, 2, rows=rows)
        self._expose()

    def _expose(self) -> None:
        self.keys, self.values = self._keys.data, self._values.data

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = self._keys.append(key_states)
        self.values = self._values.append(value_states)
        return self.keys, self.values

    def keep(self, rows: torch.Tensor, drop_left: int) -> None:
        self._keys.keep(rows, drop_left)
        self._values.keep(rows, drop_left)
        self._expose()

    def stack(self, keys: torch.Tensor, values: torch.Tensor, rows: torch.Tensor | None = None) -> None:
        self._keys.stack(keys, rows)
        self._values.stack(values, rows)
        self._expose()

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a running batch's cache is never cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a running batch's cache changes rows through keep() and stack()")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("a running batch's cache changes rows through keep() and stack()")


class GrowingCache(Cache):
    """The running batch's cache: one ``GrowingLayer`` per model layer."""

    layers: list[GrowingLayer]  # pyright: ignore[reportIncompatibleVariableOverride]

    def __init__(self, layers: Sequence[GrowingLayer]) -> None:
        super().__init__(layers=list(layers))

    @classmethod
    def from_layers(cls, layers: Sequence[Any], rows: torch.Tensor | None = None) -> GrowingCache:
        """Move a prefill's ``DynamicLayer``s (their ``keys`` / ``values``, or their rows ``rows``)
        into growing layers. Each source layer is emptied once copied (``release``), so the peak is
        the new cache plus one layer, not two whole caches: with SmolLM2's 64 demo prompts in float32
        that was 2.1 GB above the weights instead of 1.4 (``benchmarks/engine_memory.py``)."""
        grown: list[GrowingLayer] = []
        for layer in layers:
            grown.append(GrowingLayer(layer.keys, layer.values, rows))
            release(layer)
        return cls(grown)


def release(layer: Any) -> None:
    """Drop a prefill cache layer's tensors once they were copied elsewhere (the prefill's cache is
    never read again; without this its memory lives until the whole cache object is collected)."""
    layer.keys = layer.values = torch.empty(0, dtype=layer.keys.dtype, device=layer.keys.device)
