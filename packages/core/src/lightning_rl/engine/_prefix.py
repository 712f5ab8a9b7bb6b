"""Prefill that computes what the admitted prompts share only once.

Agent traffic repeats itself: every call of an agent starts with the same system prompt and tool
schemas (55 of the demo's 66 first-turn tokens), and a GRPO group sends the same prompt
``group_size`` times. A plain prefill runs every prompt token of every row through the model, so
on the demo the engine spent more time prefilling (~21k prompt tokens per RL step) than decoding
(~4k response tokens). ``SharedPrefixBatch.prefill`` instead

1. runs each distinct prompt once (duplicates get a copy of its cache row and logits), and
2. runs the longest token prefix common to those distinct prompts once, as a single row, and then
   only the rest of each prompt on top of that prefix's keys and values (expanded over the rows).

The cache layout is the one ``KVBatch`` documents, except that a row whose remainder is shorter
than the longest one carries its padding between the shared prefix and its remainder instead of
on its far left. Nothing depends on padding being leftmost: positions come from the mask
(``cumsum - 1``: padding does not advance them), attention masks padded columns wherever they
are, and trimming after rows leave only looks at columns that are padding in every row. The result
equals a plain prefill's up to float rounding (a causal prefix's keys and values do not depend on
what follows it), which is the same tolerance batching already has.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from lightning_rl.engine._batch import KVBatch

__all__ = ["SharedPrefixBatch", "common_prefix_len"]


def common_prefix_len(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix of every prompt, leaving each prompt at least one token."""
    shortest = min(len(p) for p in prompts)
    first = prompts[0]
    length = shortest - 1
    for other in prompts[1:]:
        i = 0
        while i < length and other[i] == first[i]:
            i += 1
        length = i
        if length == 0:
            break
    return max(length, 0)


class SharedPrefixBatch(KVBatch):
    """A ``KVBatch`` whose prefill shares duplicate prompts and the prompts' common prefix.

    Args:
        min_shared_tokens: the saving (prompt tokens not recomputed) below which a plain prefill is
            used: sharing costs one extra small forward pass, which a few tokens do not repay.
    """

    def __init__(self, model: Any, pad_id: int, device: torch.device, *, min_shared_tokens: int = 32) -> None:
        super().__init__(model, pad_id, device)
        self.min_shared_tokens = min_shared_tokens
        # Expanding a prefix over rows needs plain full-attention layers (no sliding window to roll).
        self._shareable = self._plain_layers(DynamicCache(config=model.config))
        #: Prompt tokens run through the model by the last prefill, and those it did not need to run.
        self.last_computed_tokens = 0
        self.last_saved_tokens = 0

    def prefill(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Run ``prompts`` (appended as the last rows) and return their next-token logits ``[n, V]``."""
        total = sum(len(p) for p in prompts)
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        unique = [list(p) for p in distinct]
        shared = common_prefix_len(unique) if len(unique) > 1 else 0
        if shared * (len(unique) - 1) < self.min_shared_tokens:
            shared = 0  # too short a prefix to repay its own forward pass
        computed = sum(len(p) for p in unique) - shared * (len(unique) - 1)
        if not self._shareable or total - computed < self.min_shared_tokens:
            self.last_computed_tokens, self.last_saved_tokens = total, 0
            return super().prefill(prompts)
        cache, mask, logits = self._run(unique, shared)
        index = None
        if len(unique) < len(prompts):  # duplicates: their rows are copied once, into the running cache
            index = torch.tensor(rows, dtype=torch.long, device=self._device)
            logits = logits.index_select(0, index)
        self._join(cache, mask, index)
        self.last_computed_tokens, self.last_saved_tokens = computed, total - computed
        return logits

    def _run(self, prompts: list[list[int]], shared: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Prefill ``prompts`` whose first ``shared`` tokens are equal: that prefix once, then the rest."""
        n = len(prompts)
        cache: Any = DynamicCache(config=self._model.config)
        if shared > 0:
            prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=self._device)
            ones = torch.ones((1, shared), dtype=torch.long, device=self._device)
            self._forward(prefix, ones, torch.arange(shared, device=self._device).unsqueeze(0), cache)
            for layer in cache.layers:
                # The next forward concatenates onto these, which materialises the rows.
                layer.keys = layer.keys.expand(n, -1, -1, -1)
                layer.values = layer.values.expand(n, -1, -1, -1)
        rests = [p[shared:] for p in prompts]
        width = max(len(r) for r in rests)
        ids = torch.full((n, width), self._pad_id, dtype=torch.long)
        rest_mask = torch.zeros((n, width), dtype=torch.long)
        for row, rest in enumerate(rests):
            ids[row, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            rest_mask[row, width - len(rest) :] = 1
        ids, rest_mask = ids.to(self._device), rest_mask.to(self._device)
        mask = torch.cat([rest_mask.new_ones((n, shared)), rest_mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        out = self._forward(ids, mask, positions, cache)
        return out.past_key_values, mask, out.logits[:, -1, :]
