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
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["ATTENTION", "gqa_sdpa_attention_forward", "use_gqa_attention"]

ATTENTION = "lightning_gqa_sdpa"
"""The name this attention function is registered under in transformers."""


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
    """transformers' ``sdpa_attention_forward``, with GQA in the kernel when a mask is given on CPU."""
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
