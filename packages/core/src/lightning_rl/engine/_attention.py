"""SDPA attention that does not copy the KV cache per query head on CPU (grouped-query attention).

Models with fewer key/value heads than query heads (GQA: the tiny model has 2 for 4, SmolLM2 3 for
9) share each cached key/value head between several query heads. transformers' ``sdpa`` attention
passes ``enable_gqa=True`` to ``torch.nn.functional.scaled_dot_product_attention`` only when there is
no attention mask, because on CUDA a mask sends SDPA to its math kernel; with a mask (any padded
batch, so every decode step of the engine) it first materialises the repeated heads
(``repeat_kv``: a copy of the whole cache, twice, per layer and step). On CPU, SDPA's flash kernel
takes a mask and GQA together and indexes the shared head instead, with bit-identical outputs (the
kernel does the same arithmetic on the same numbers; ``tests/core/engine/test_engine_kvcache.py``
compares with ``torch.equal``). Everywhere else (no mask, another device, one query head per key
head) this defers to transformers' ``sdpa`` unchanged.

``use_gqa_attention`` switches a model that uses ``sdpa`` to this function; it is registered under
``ATTENTION`` with ``sdpa``'s mask builder, which transformers looks up by the same name.

A forward pass may also carry a ``shared_prefix`` (a ``PrefixKV``): the keys and values of a token
prefix that several rows of the batch start with, held once instead of once per row (the agent's
system prompt and tool schemas, ~280 of each SmolLM2 demo prompt's ~310 tokens). The cache then holds
only what follows the prefix, and ``prefix_attention`` attends over both: the prefix as one matrix
product for every row's queries at once (the rows share its keys), the rest per row with its mask,
joined by their softmax normalisers (the log-sum-exp merge of blockwise attention). Same numbers up
to float rounding, as a plain prefill of the whole prompt gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = [
    "ATTENTION",
    "SCORE_CHUNK",
    "PrefixKV",
    "gqa_sdpa_attention_forward",
    "prefix_attention",
    "use_gqa_attention",
]

ATTENTION = "lightning_gqa_sdpa"
"""The name this attention function is registered under in transformers."""


@dataclass
class PrefixKV:
    """The keys and values of a token prefix held once for the rows of a batch that start with it.

    ``keys[i]`` / ``values[i]`` are layer ``i``'s ``[1, kv_heads, len(tokens), head_dim]`` (positions
    ``0 .. len(tokens) - 1``); ``rows`` (``[B]`` bool) marks the batch rows that sit on the prefix, whose
    cache holds only what follows it; the other rows attend over their own cache only. ``key`` names
    what else the keys and values depend on (the adapter they were computed with).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    tokens: tuple[int, ...]
    key: object
    rows: torch.Tensor

    @property
    def length(self) -> int:
        return len(self.tokens)

    def offsets(self) -> torch.Tensor:
        """``[B, 1]`` position of each row's first cached column: the prefix length, or 0 off it."""
        return (self.rows.long() * self.length).unsqueeze(-1)


SCORE_CHUNK = 4_000_000
"""Most attention scores ``prefix_attention`` materialises at once (16 MB in float32; each is held
in a few temporaries): bounds a large prefill's transient memory, while a decode step (one query per
row) stays a single chunk."""


def prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    prefix_key: torch.Tensor,
    prefix_value: torch.Tensor,
    on_prefix: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of ``query`` ``[B, H, q, d]`` over a shared prefix (``[1, h, P, d]``, seen by the
    rows ``on_prefix`` marks) followed by each row's own keys ``[B, h, S, d]`` (the last ``q`` of which
    are the queries' own). ``attention_mask``: sdpa's boolean ``[B, 1, q, S]`` (True: attend), or None
    for causal over the last ``q`` columns. Returns ``[B, q, H, d]``, as transformers' attention does.

    Scores are kept in float32 (as SDPA's CPU kernels accumulate); a query that sees nothing in one
    part (a padding query, a row off the prefix) gets weight 0 there, not NaN. The scores are
    materialised, unlike SDPA's: a prefill of many rows runs in chunks of rows holding at most
    ``SCORE_CHUNK`` scores each (a decode step is one chunk)."""
    batch, heads, q, _ = query.shape
    step = max(1, SCORE_CHUNK // (heads * q * (prefix_key.shape[2] + key.shape[2])))
    parts = [
        _attend_chunk(
            query[i : i + step],
            (key[i : i + step], value[i : i + step]),
            (prefix_key, prefix_value),
            on_prefix[i : i + step],
            None if attention_mask is None else attention_mask[i : i + step],
            scale,
        )
        for i in range(0, batch, step)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _attend_chunk(
    query: torch.Tensor,
    own: tuple[torch.Tensor, torch.Tensor],
    prefix: tuple[torch.Tensor, torch.Tensor],
    on_prefix: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """``prefix_attention`` on one chunk of rows: ``own`` and ``prefix`` are (keys, values)."""
    (key, value), (prefix_key, prefix_value) = own, prefix
    batch, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    rows = query.reshape(batch, kv_heads, groups * q, dim)
    # the prefix: every row's queries against the one copy of its keys, as one product per head
    folded = rows.transpose(0, 1).reshape(1, kv_heads, batch * groups * q, dim)
    s1 = torch.matmul(folded, prefix_key.transpose(-1, -2)).float().mul_(scale)
    s1 = s1.view(kv_heads, batch, groups * q, -1).transpose(0, 1)
    s1 = s1.masked_fill(~on_prefix.view(batch, 1, 1, 1), float("-inf"))
    # each row's own columns, under its mask
    s2 = torch.matmul(rows, key.transpose(-1, -2)).float().mul_(scale)
    columns = key.shape[2]
    if attention_mask is not None and attention_mask.dtype != torch.bool:  # an additive mask: 0 where seen
        attention_mask = attention_mask == 0
    if attention_mask is None:
        visible = torch.ones((q, columns), dtype=torch.bool, device=query.device).tril(columns - q)
        attention_mask = visible.view(1, 1, q, columns)
    s2 = s2.view(batch, kv_heads, groups, q, columns).masked_fill(~attention_mask.unsqueeze(2), float("-inf"))
    s2 = s2.view(batch, kv_heads, groups * q, columns)
    m1 = s1.amax(-1, keepdim=True).clamp_min(-1e30)
    m2 = s2.amax(-1, keepdim=True).clamp_min(-1e30)
    m = torch.maximum(m1, m2)
    e1 = s1.sub_(m).exp_()
    e2 = s2.sub_(m).exp_()
    total = e1.sum(-1, keepdim=True) + e2.sum(-1, keepdim=True)
    e1 = e1.transpose(0, 1).reshape(1, kv_heads, batch * groups * q, -1).to(prefix_value.dtype)
    out1 = torch.matmul(e1, prefix_value).view(kv_heads, batch, groups * q, dim).transpose(0, 1)
    out = torch.matmul(e2.to(value.dtype), value).float().add_(out1.float()).div_(total)
    return out.to(query.dtype).view(batch, heads, q, dim).transpose(1, 2).contiguous()


def gqa_sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa_attention_forward``, with GQA in the kernel when a mask is given on CPU;
    ``prefix_attention`` when the forward pass carries a ``shared_prefix``."""
    prefix: PrefixKV | None = kwargs.pop("shared_prefix", None)
    if prefix is not None:
        layer: int = getattr(module, "layer_idx")  # noqa: B009 (typed: torch's __getattr__ is not)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        out = prefix_attention(
            query, key, value, prefix.keys[layer], prefix.values[layer], prefix.rows, attention_mask, scale
        )
        return out, None
    groups = int(getattr(module, "num_key_value_groups", 1))
    if attention_mask is None or groups == 1 or query.device.type != "cpu" or kwargs.get("output_attentions"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    # With a mask, transformers' version is never causal (the mask carries causality) and repeats the
    # key/value heads; the kernel does that by indexing here.
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=False, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


def use_gqa_attention(model: Any) -> bool:
    """Switch ``model`` from ``sdpa`` to ``gqa_sdpa_attention_forward``; whether it did.

    Models on another attention implementation (eager, flash, flex) or that cannot switch at runtime
    are left as they are.
    """
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", ATTENTION):
        return False
    can_set = getattr(model, "_can_set_attn_implementation", None)
    if can_set is None or not can_set():
        return False
    AttentionInterface.register(ATTENTION, gqa_sdpa_attention_forward)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    model.set_attn_implementation(ATTENTION)
    return True
