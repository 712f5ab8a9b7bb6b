"""The running batch's in-place KV cache and GQA attention give the very numbers of the plain path.

``KVBatch`` keeps keys, values and mask in buffers with reserved columns (``engine._kvcache``) and
switches the model to SDPA with grouped-query attention in the kernel (``engine._attention``). Both
change where numbers are stored, not the arithmetic on them, so the logits must be bit-identical to
what transformers' ``DynamicCache`` (``torch.cat`` per step) and ``sdpa`` attention (key/value heads
repeated) give for the same padded batch. With the locked transformers (uv.lock) they are
bit-identical; transformers 5.23's ``sdpa`` path rounds differently by up to 2.4e-7 on these logits
(``bash .ci/newest engine``, 2026-11-25), so logits are compared within ``ATOL`` = 1e-5 (40x that,
and far below any difference that could change a sampled token), and every greedy token must agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from lightning_rl.engine._attention import ATTENTION, use_gqa_attention
from lightning_rl.engine._batch import KVBatch
from lightning_rl.engine._kvcache import MIN_CAPACITY, ColumnBuffer, GrowingCache, capacity_for

ATOL = 1e-5
"""Logit tolerance between our path and transformers' (see the module docstring for the measurement)."""


def _same(a: torch.Tensor, b: torch.Tensor, what: str = "logits") -> None:
    torch.testing.assert_close(a, b, rtol=0.0, atol=ATOL, msg=lambda m: f"{what}: {m}")
    assert _greedy(a) == _greedy(b), f"{what}: greedy tokens differ"


PAD = 0


def _left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


class PlainBatch:
    """The reference: the same left-padded batch on transformers' own ``DynamicCache`` (``torch.cat``
    of the whole cache and mask every step), as the engine ran before the in-place cache."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: Any = None
        self.mask: torch.Tensor | None = None

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> Any:
        return self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )

    def prefill(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        out = self._forward(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), DynamicCache(config=self.model.config))
        if self.cache is None or self.mask is None:
            self.cache, self.mask = out.past_key_values, mask
        else:
            length = max(self.mask.shape[1], width)
            for old, new in zip(self.cache.layers, out.past_key_values.layers, strict=True):
                old.keys = torch.cat([_left_pad(old.keys, length, 2), _left_pad(new.keys, length, 2)])
                old.values = torch.cat([_left_pad(old.values, length, 2), _left_pad(new.values, length, 2)])
            self.mask = torch.cat([_left_pad(self.mask, length, 1), _left_pad(mask, length, 1)])
        return out.logits[:, -1, :]

    def decode(self, tokens: Sequence[int]) -> torch.Tensor:
        assert self.mask is not None
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(tokens), 1))], dim=1)
        ids = torch.tensor(tokens).unsqueeze(-1)
        out = self._forward(ids, self.mask, self.mask.sum(-1, keepdim=True) - 1, self.cache)
        return out.logits[:, -1, :]

    def keep(self, rows: Sequence[int]) -> None:
        assert self.mask is not None
        index = torch.tensor(rows)
        self.cache.batch_select_indices(index)
        self.mask = self.mask.index_select(0, index)
        first_real = int(self.mask.any(dim=0).int().argmax())
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, first_real:, :]
            layer.values = layer.values[:, :, first_real:, :]
        self.mask = self.mask[:, first_real:]


@pytest.fixture(scope="module")
def models(tiny_path: Path) -> tuple[Any, Any]:
    """The tiny model twice: one for ``KVBatch`` (switched to GQA attention), one left on ``sdpa``."""
    ours = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="sdpa").eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="sdpa").eval()
    assert plain.config.num_key_value_heads < plain.config.num_attention_heads, "the test needs a GQA model"
    return ours, plain


def _prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (5 + (7 * i) % 23,), generator=generator).tolist() for i in range(count)]


def _greedy(logits: torch.Tensor) -> list[int]:
    return [int(t) for t in logits.argmax(-1)]


def test_rows_joining_leaving_and_growing_past_capacity_match_the_plain_cache(models: tuple[Any, Any]) -> None:
    ours, plain = models
    batch, reference = KVBatch(ours, PAD, torch.device("cpu")), PlainBatch(plain)
    assert ours.config._attn_implementation == ATTENTION
    with torch.inference_mode():
        first = _prompts(3, seed=0)
        a, b = batch.prefill(first), reference.prefill(first)
        _same(a, b, "first prefill")
        tokens = _greedy(a)
        for step in range(80):  # past the first reservation of MIN_CAPACITY columns, so the cache grows
            if step == 5:  # newcomers, one longer than the running rows' window
                joining = [*_prompts(2, seed=1), list(range(3, 3 + batch.length + 4))]
                a, b = batch.prefill(joining), reference.prefill(joining)
                _same(a, b, "joining prefill")
                tokens += _greedy(a)
            if step in (20, 50):  # rows leave (the longest one first: its padding columns are trimmed)
                rows = [i for i in range(len(tokens)) if i != len(tokens) - 1 and i != 1]
                batch.keep(rows)
                reference.keep(rows)
                tokens = [tokens[i] for i in rows]
                assert reference.mask is not None and batch.length == reference.mask.shape[1]
            a, b = batch.decode(tokens), reference.decode(tokens)
            _same(a, b, f"decode step {step}")
            tokens = _greedy(a)
    assert batch.length > MIN_CAPACITY
    cache = batch._cache  # pyright: ignore[reportPrivateUsage]
    assert isinstance(cache, GrowingCache)
    assert cache.layers[0].keys.shape[2] == batch.length


def test_a_decode_step_writes_in_place_until_the_room_runs_out() -> None:
    data = torch.arange(6.0).reshape(2, 3)
    columns = ColumnBuffer(data, 1)
    assert columns.capacity == MIN_CAPACITY and torch.equal(columns.data, data)
    before = columns.data.data_ptr()
    for step in range(MIN_CAPACITY - 3):
        grown = columns.append(torch.full((2, 1), float(step)))
        assert grown.data_ptr() == before  # no copy while reserved columns last
    assert columns.columns == MIN_CAPACITY
    columns.append(torch.zeros((2, 1)))  # full: the capacity grows by one step, the data moves once
    assert columns.capacity == 2 * MIN_CAPACITY and columns.columns == MIN_CAPACITY + 1
    assert torch.equal(columns.data[:, :3], data) and columns.data[1, 3 + 7] == 7.0


def test_keep_and_stack_move_only_the_window() -> None:
    columns = ColumnBuffer(torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]]), 1)
    columns.keep(torch.tensor([2, 0]), drop_left=1)
    assert columns.data.tolist() == [[0, 1], [1, 1]]
    columns.stack(torch.tensor([[1, 1, 1, 1]]))  # wider: the running rows get left padding (zeros)
    assert columns.data.tolist() == [[0, 0, 0, 1], [0, 0, 1, 1], [1, 1, 1, 1]]
    columns.stack(torch.tensor([[1]]))
    assert columns.data.tolist()[-1] == [0, 0, 0, 1]
    columns.stack(torch.tensor([[0, 1], [1, 1]]), rows=torch.tensor([1, 0, 1]))  # rows repeated, once copied
    assert columns.data.tolist()[-3:] == [[0, 0, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1]]
    selected = ColumnBuffer(torch.tensor([[0, 1], [1, 1]]), 1, rows=torch.tensor([1, 1, 0]))
    assert selected.data.tolist() == [[1, 1], [1, 1], [0, 1]] and selected.capacity == MIN_CAPACITY
    assert capacity_for(1) == MIN_CAPACITY and capacity_for(65) == 128 and capacity_for(128) == 128
    assert capacity_for(330) == 384  # a fixed step, not the next power of two (512): less room held per row


def test_gqa_attention_equals_sdpa_on_a_padded_batch(models: tuple[Any, Any]) -> None:
    ours, plain = models
    use_gqa_attention(ours)
    ids = torch.tensor([[PAD, PAD, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (ids != PAD).long()
    with torch.inference_mode():
        a = ours(input_ids=ids, attention_mask=mask).logits
        b = plain(input_ids=ids, attention_mask=mask).logits
    _same(a[:, -1], b[:, -1])
    torch.testing.assert_close(a, b, rtol=0.0, atol=ATOL)


def test_gqa_attention_leaves_other_implementations_alone(tiny_path: Path) -> None:
    eager = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="eager")
    assert not use_gqa_attention(eager)
    assert eager.config._attn_implementation == "eager"
