"""Prefill that computes what the admitted prompts share only once, and holds it once.

Agent traffic repeats itself: every call of an agent starts with the same system prompt and tool
schemas (55 of the demo's 66 first-turn tokens; ~280 of SmolLM2's ~310), and a GRPO group sends the
same prompt ``group_size`` times. A plain prefill runs every prompt token of every row through the
model, so on the demo the engine spent more time prefilling (~21k prompt tokens per RL step) than
decoding (~4k response tokens), and the KV cache held the system prompt once per row (in float32,
~0.8 of the SmolLM2 demo's ~1.1 GB of rollout cache). ``SharedPrefixBatch.prefill`` instead

1. runs each distinct prompt once (duplicates get a copy of its cache row and logits);
2. runs the longest token prefix common to those distinct prompts once, as a single row, and keeps
   its keys and values once for the batch (``PrefixKV``): the rows' cache holds only what follows
   it, and attention reads the prefix through ``_attention.prefix_attention``;
3. serves later joins from the held prefix: an agent's next turn (whose prompt starts with the same
   system prompt) runs only its own tokens. The engine prefills the prompts that continue the held
   prefix apart from the others (``on_held_prefix``), and the prefix goes when no row is on it.

A batch holds one prefix. Rows that do not start with it (another system prompt, another adapter)
keep their whole prompt in their own cache, as before: their common prefix is still computed once
for them, then copied into each row. Row positions start after the prefix (``PrefixKV.offsets``);
padding may sit between a shared prefix and a row's remainder, which nothing minds: positions come
from the mask (``cumsum - 1``), attention masks padded columns wherever they are, and trimming only
drops columns that are padding in every row. Results equal a plain prefill's up to float rounding (a
causal prefix's keys and values do not depend on what follows it), the tolerance batching already has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from lightning_rl.engine._attention import PrefixKV
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

    def prefill(self, prompts: Sequence[Sequence[int]], key: object = None) -> torch.Tensor:
        """Run ``prompts`` (appended as the last rows) and return their next-token logits ``[n, V]``.

        ``key`` names what the keys and values depend on besides the tokens (the adapter in use): a
        held prefix serves only prompts of the same key."""
        total = sum(len(p) for p in prompts)
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        unique = [list(p) for p in distinct]
        if all(self.on_held_prefix(p, key) for p in unique):
            return self._prefill_on_prefix(unique, rows, total)
        shared = common_prefix_len(unique) if len(unique) > 1 else 0
        if shared * (len(unique) - 1) < self.min_shared_tokens:
            shared = 0  # too short a prefix to repay its own forward pass
        computed = sum(len(p) for p in unique) - shared * (len(unique) - 1)
        if not self._shareable or total - computed < self.min_shared_tokens:
            self.last_computed_tokens, self.last_saved_tokens = total, 0
            return super().prefill(prompts)
        if shared > 0 and self._prefix is None and self._own_attention:  # hold it once, for these and later rows
            self._prefix = self._compute_prefix(unique[0][:shared], key)
            try:
                return self._prefill_on_prefix(unique, rows, total, computed=computed)
            except BaseException:  # e.g. out of memory: the running rows stay as they were, without it
                self._prefix = None
                raise
        # the batch already holds another prefix: compute this one once, but give each row a copy
        cache, mask, logits = self._run(unique, shared)
        index = self._duplicates(rows, len(unique))
        if index is not None:
            logits = logits.index_select(0, index)
        self._join(cache, mask, index)
        self.last_computed_tokens, self.last_saved_tokens = computed, total - computed
        return logits

    def on_held_prefix(self, prompt: Sequence[int], key: object = None) -> bool:
        """Whether ``prompt`` (under ``key``) continues the prefix the batch holds: such prompts are best
        prefilled together, running only their own tokens."""
        held = self._prefix
        if held is None or held.key != key or len(prompt) <= held.length:
            return False
        return tuple(prompt[: held.length]) == held.tokens

    def _duplicates(self, rows: list[int], distinct: int) -> torch.Tensor | None:
        """The row of each prompt among the distinct ones, when some repeat (copied once, into the
        running cache), else None."""
        return torch.tensor(rows, dtype=torch.long, device=self._device) if distinct < len(rows) else None

    def _compute_prefix(self, tokens: list[int], key: object) -> PrefixKV:
        """Run ``tokens`` as one row and keep its keys and values as the batch's shared prefix."""
        cache: Any = DynamicCache(config=self._model.config)
        ids = torch.tensor([tokens], dtype=torch.long, device=self._device)
        ones = torch.ones_like(ids)
        self._forward(ids, ones, torch.arange(len(tokens), device=self._device).unsqueeze(0), cache)
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        rows = torch.zeros(self.size, dtype=torch.bool, device=self._device)
        return PrefixKV(keys, values, tuple(tokens), key, rows)

    def _prefill_on_prefix(
        self, prompts: list[list[int]], rows: list[int], total: int, computed: int | None = None
    ) -> torch.Tensor:
        """Prefill what follows the held prefix in each of ``prompts`` (distinct; ``rows`` maps the
        requests onto them) and join them as rows on the prefix. ``computed``: the prompt tokens run,
        when the prefix itself was just computed for them."""
        assert self._prefix is not None
        prefix = dataclasses.replace(self._prefix, rows=torch.ones(len(prompts), dtype=torch.bool, device=self._device))
        start = prefix.length
        ids, mask = self._left_padded([p[start:] for p in prompts])
        positions = (mask.cumsum(-1) - 1).clamp(min=0) + start
        out = self._forward(ids, mask, positions, DynamicCache(config=self._model.config), prefix)
        logits = out.logits[:, -1, :]
        index = self._duplicates(rows, len(prompts))
        if index is not None:
            logits = logits.index_select(0, index)
        self._join(out.past_key_values, mask, index, on_prefix=True)
        ran = sum(len(p) - start for p in prompts) if computed is None else computed
        self.last_computed_tokens, self.last_saved_tokens = ran, total - ran
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
        ids, rest_mask = self._left_padded([p[shared:] for p in prompts])
        mask = torch.cat([rest_mask.new_ones((n, shared)), rest_mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        out = self._forward(ids, mask, positions, cache)
        return out.past_key_values, mask, out.logits[:, -1, :]
