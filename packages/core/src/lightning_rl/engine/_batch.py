"""The tensors of a running batch: one left-padded KV cache shared by every in-flight sequence.

Layout: row ``i`` of the cache holds ``L`` positions, of which the first ``L - n_i`` are padding (masked
out by ``mask``) and the last ``n_i`` are its real tokens. Padding only ever sits on the left, so
every row appends its next token at the same column and one forward pass serves the whole batch.
Rotary positions come from the mask (``n_i`` real tokens so far), not from the column, so a row's
numbers do not depend on how much padding it carries. A row on the batch's held prefix
(``_prefix.SharedPrefixBatch``, ``PrefixKV``) caches only what follows that prefix, and its
positions start after it.

Continuous batching: new sequences are prefilled together in their own cache, which is then padded on
the left to the running cache's length (or the other way round) and stacked along the batch axis.
Finished sequences are dropped with ``index_select`` and columns that became padding for every
remaining row are trimmed. This needs plain ``DynamicLayer`` prefill caches (full attention); for
other cache kinds (sliding windows, recurrent state) ``can_merge`` is false and the scheduler only
starts a new batch once the current one has drained.

The running cache and mask grow in place (``_kvcache``: reserved columns, doubled when full), so a
decode step writes one column instead of copying the cache, and the model runs SDPA with grouped-query
attention in the kernel (``_attention``) instead of a per-step copy of the cache for every query
head. On the demo's 128-row decode step those two copies were ~38% of the step, and its CPU time
halved without them (``benchmarks/engine_decode_step.py``, benchmarks/README.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from lightning_rl.engine._attention import PrefixKV, use_gqa_attention
from lightning_rl.engine._kvcache import ColumnBuffer, GrowingCache, release

__all__ = ["KVBatch"]


class KVBatch:
    """A model's KV cache for the rows of a batch, with row join/leave.

    Switches ``model`` to ``_attention``'s SDPA (same numbers, no per-head copy of the cache) when it
    uses transformers' ``sdpa``.
    """

    def __init__(self, model: Any, pad_id: int, device: torch.device) -> None:
        self._model = model
        self._pad_id = pad_id
        self._device = device
        self._own_attention = use_gqa_attention(model)  # which can read a shared prefix (``PrefixKV``)
        self._cache: Any = None  # a GrowingCache, or the prefill's own cache when it cannot merge
        self._mask: ColumnBuffer | None = None  # [B, L] int64, 1 = real token
        self._prefix: PrefixKV | None = None  # a prefix held once for the rows on it (``_prefix``)

    @property
    def size(self) -> int:
        return 0 if self._mask is None else int(self._mask.data.shape[0])

    @property
    def length(self) -> int:
        """Columns in the cache (the longest row, padding included)."""
        return 0 if self._mask is None else self._mask.columns

    @property
    def can_merge(self) -> bool:
        """Whether new rows can join while others are running (plain full-attention cache)."""
        return self._cache is None or isinstance(self._cache, GrowingCache)

    @staticmethod
    def _plain_layers(cache: Any) -> bool:
        layers = getattr(cache, "layers", None)
        return isinstance(layers, list) and all(type(layer) is DynamicLayer for layer in layers)  # noqa: E721

    def reset(self) -> None:
        self._cache = None
        self._mask = None
        self._prefix = None

    def _forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        prefix: PrefixKV | None = None,
    ) -> Any:
        """One forward pass; with ``prefix`` (a ``PrefixKV``) its rows also attend over the shared prefix."""
        extra = {} if prefix is None else {"shared_prefix": prefix}
        return self._model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )

    def prefill(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Run ``prompts`` (appended as the last rows) and return their next-token logits ``[n, V]``."""
        ids, mask = self._left_padded(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self._forward(ids, mask, positions, DynamicCache(config=self._model.config))
        self._join(out.past_key_values, mask)
        return out.logits[:, -1, :]

    def _left_padded(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token rows as left-padded ``[n, width]`` ids and their mask (1 = real token)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = 1
        return ids.to(self._device), mask.to(self._device)

    def _join(
        self, cache: Any, mask: torch.Tensor, rows: torch.Tensor | None = None, *, on_prefix: bool = False
    ) -> None:
        """Add a prefill's rows (its cache and ``[n, L]`` mask; or its rows ``rows``, repeats allowed,
        copied once into the running cache) after the running ones; ``on_prefix``: their cache follows
        the batch's shared prefix."""
        joined = None  # which rows sit on the held prefix, marked once the new ones have joined
        if self._prefix is not None:
            added = int(mask.shape[0] if rows is None else rows.shape[0])
            flags = torch.full((added,), on_prefix, dtype=torch.bool, device=self._prefix.rows.device)
            joined = torch.cat([self._prefix.rows, flags])
        plain = self._plain_layers(cache)
        if self._cache is None or self._mask is None:
            if plain:
                self._cache = GrowingCache.from_layers(cache.layers, rows)
            else:
                if rows is not None:
                    cache.batch_select_indices(rows)
                self._cache = cache
            self._mask = ColumnBuffer(mask, 1, rows=rows)
        else:
            if not (isinstance(self._cache, GrowingCache) and plain):
                raise RuntimeError(
                    "cannot merge KV caches of this kind; the scheduler must wait for the batch to drain"
                )
            for layer, new in zip(self._cache.layers, cache.layers, strict=True):
                layer.stack(new.keys, new.values, rows)
                release(new)  # one layer at a time: the prefill's cache and the grown one never both whole
            self._mask.stack(mask, rows)
        if self._prefix is not None and joined is not None:
            self._prefix.rows = joined

    def decode(self, next_tokens: Sequence[int]) -> torch.Tensor:
        """Feed one token per row and return the next-token logits ``[B, V]``."""
        assert self._mask is not None, "decode() before prefill()"
        ids = torch.tensor(next_tokens, dtype=torch.long, device=self._device).unsqueeze(-1)
        mask = self._mask.append(ids.new_ones((self.size, 1)))
        positions = mask.sum(-1, keepdim=True) - 1
        if self._prefix is not None:
            positions = positions + self._prefix.offsets()
        out = self._forward(ids, mask, positions, self._cache, self._prefix)
        self._cache = out.past_key_values
        return out.logits[:, -1, :]

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (in that order), then trim columns that are padding for every row left."""
        if not rows:
            self.reset()
            return
        assert self._mask is not None
        if len(rows) == self.size and list(rows) == list(range(self.size)):
            return
        index = torch.tensor(list(rows), dtype=torch.long, device=self._device)
        if self._prefix is not None:
            self._prefix.rows = self._prefix.rows.index_select(0, index)
            if not bool(self._prefix.rows.any()):  # nobody left on it: its memory goes
                self._prefix = None
        if not isinstance(self._cache, GrowingCache):
            self._cache.batch_select_indices(index)
            self._mask.keep(index)
            return
        first_real = int(self._mask.data.index_select(0, index).any(dim=0).int().argmax())
        for layer in self._cache.layers:
            layer.keep(index, first_real)
        self._mask.keep(index, first_real)
