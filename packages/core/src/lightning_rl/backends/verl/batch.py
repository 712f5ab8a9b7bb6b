"""Transitions -> VeRL ``DataProto``, laid out exactly as VeRL's agent loop lays out its own rollouts.

VeRL's actor expects one row per sample with the prompt **left**-padded and the response
**right**-padded, so every response starts at the same column ``P`` (the prompt width)::

    input_ids      = [pad pad p0 p1 p2 | r0 r1 r2 pad]      prompts | responses
    attention_mask = [ 0   0  1  1  1  |  1  1  1  0 ]
    position_ids   = [ 0   0  0  1  2  |  3  4  5  5 ]      cumsum(mask) - 1, clipped at 0
    response_mask  =                    [ 1  1  1  0 ]
    token_level_scores                  [ 0  0  R  0 ]      the score sits on the last response token

Each transition (one LLM call of a trainable role) is an independent single-turn sample, the
LightningRL formulation. ``uid`` is the transition's GRPO group id (one per task and step), so a
group-wise estimator compares rollouts of the same task. Advantages computed by LightningRL
(``lightning_rl.credit``) are broadcast over the response tokens into ``advantages``/``returns``;
``score_rollouts`` in ``advantages.py`` lets VeRL compute them instead, at rollout level.

Nothing is dropped or cut silently: a sample longer than a configured limit raises, or (with
``overlong="drop"``) is left out and counted in ``verl/overlong_dropped``; transitions without
tokens are counted in ``verl/empty_dropped``. When the batch size must be a multiple of the data
parallel size times the number of mini-batches, the batch is padded with copies whose
``response_mask`` (and advantage) is zero, so they add no loss and no token to a token-mean, and
their count is reported; the batch is never randomly trimmed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from lightning_rl.backends.verl._require import require_verl
from lightning_rl.types import Transition

require_verl()

from verl import DataProto  # noqa: E402  # pyright: ignore[reportMissingImports]

__all__ = ["Overlong", "BatchConfig", "VerlBatch", "transitions_to_dataproto", "PAD_UID_PREFIX"]

Overlong = Literal["error", "drop"]

PAD_UID_PREFIX = "__lightning_pad__"
"""``uid`` prefix of padding rows (never a real group id)."""


@dataclass
class BatchConfig:
    """How transitions are laid out. Widths default to the longest prompt/response of the batch."""

    pad_token_id: int = 0
    max_prompt_length: int | None = None
    """Widest allowed prompt (VeRL's ``data.max_prompt_length``); None: no limit."""
    max_response_length: int | None = None
    """Widest allowed response (VeRL's ``data.max_response_length``); None: no limit."""
    overlong: Overlong = "error"
    """A sample over a limit: ``error`` raises, ``drop`` leaves it out and counts it. Never truncated."""
    size_divisor: int = 1
    """Rows are padded (zero-mask copies) up to a multiple of this (data-parallel size x mini-batches)."""
    require_logprobs: bool = True
    """Every transition must carry the engine's sampled logprobs (needed for ``rollout_log_probs``)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts, passed to the actor in ``meta_info``."""

    def __post_init__(self) -> None:
        if self.size_divisor < 1:
            raise ValueError(f"size_divisor must be >= 1, got {self.size_divisor}.")
        if self.overlong not in ("error", "drop"):
            raise ValueError(f"overlong must be 'error' or 'drop', got {self.overlong!r}.")


@dataclass
class VerlBatch:
    """A ``DataProto`` plus the bookkeeping the trainer reports."""

    data: DataProto
    transitions: list[Transition]
    """The transitions of the real rows, in row order (padding rows come after them)."""
    n_pad_rows: int = 0
    overlong: list[Transition] = field(default_factory=list[Transition])
    empty: list[Transition] = field(default_factory=list[Transition])

    @property
    def n_rows(self) -> int:
        return len(self.transitions) + self.n_pad_rows

    def metrics(self) -> dict[str, float]:
        return {
            "verl/rows": float(self.n_rows),
            "verl/pad_rows": float(self.n_pad_rows),
            "verl/overlong_dropped": float(len(self.overlong)),
            "verl/empty_dropped": float(len(self.empty)),
            "verl/prompt_width": float(self.data.batch["prompts"].shape[1]),
            "verl/response_width": float(self.data.batch["responses"].shape[1]),
        }


def _over_limit(t: Transition, cfg: BatchConfig) -> str | None:
    if cfg.max_prompt_length is not None and len(t.prompt_ids) > cfg.max_prompt_length:
        return f"prompt of {len(t.prompt_ids)} tokens > max_prompt_length={cfg.max_prompt_length}"
    if cfg.max_response_length is not None and len(t.response_ids) > cfg.max_response_length:
        return f"response of {len(t.response_ids)} tokens > max_response_length={cfg.max_response_length}"
    return None


def _select(
    transitions: Sequence[Transition], cfg: BatchConfig
) -> tuple[list[Transition], list[Transition], list[Transition]]:
    kept: list[Transition] = []
    overlong: list[Transition] = []
    empty: list[Transition] = []
    for t in transitions:
        if not t.prompt_ids or not t.response_ids:
            empty.append(t)
            continue
        reason = _over_limit(t, cfg)
        if reason is not None:
            if cfg.overlong == "error":
                raise ValueError(
                    f"transition {t.span_id} of rollout {t.rollout_id}: {reason}. Raise the limit, or set "
                    "overlong='drop' to leave such samples out (they are counted in verl/overlong_dropped)."
                )
            overlong.append(t)
            continue
        if t.response_logprobs is not None and len(t.response_logprobs) != len(t.response_ids):
            raise ValueError(
                f"transition {t.span_id}: {len(t.response_logprobs)} logprobs "
                f"for {len(t.response_ids)} response tokens."
            )
        if cfg.require_logprobs and t.response_logprobs is None:
            raise ValueError(
                f"transition {t.span_id} has no sampled logprobs; record them at the gateway (vLLM: logprobs + "
                "return_token_ids) or set require_logprobs=False and recompute old logprobs on the actor."
            )
        kept.append(t)
    return kept, overlong, empty


def transitions_to_dataproto(transitions: Sequence[Transition], config: BatchConfig | None = None) -> VerlBatch:
    """Lay ``transitions`` out as VeRL's actor expects them (see the module docstring)."""
    cfg = config or BatchConfig()
    kept, overlong, empty = _select(transitions, cfg)
    if not kept:
        raise ValueError(
            f"no usable transition: {len(empty)} without tokens, {len(overlong)} over the length limits "
            f"(of {len(transitions)})."
        )
    n = len(kept)
    n_rows = -(-n // cfg.size_divisor) * cfg.size_divisor
    width_p = cfg.max_prompt_length or max(len(t.prompt_ids) for t in kept)
    width_r = cfg.max_response_length or max(len(t.response_ids) for t in kept)

    prompts = torch.full((n_rows, width_p), cfg.pad_token_id, dtype=torch.long)
    responses = torch.full((n_rows, width_r), cfg.pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n_rows, width_p), dtype=torch.long)
    response_attn = torch.zeros((n_rows, width_r), dtype=torch.long)
    rollout_logp = torch.zeros((n_rows, width_r), dtype=torch.float32)
    scores = torch.zeros((n_rows, width_r), dtype=torch.float32)
    adv = torch.zeros((n_rows, width_r), dtype=torch.float32)
    ret = torch.zeros((n_rows, width_r), dtype=torch.float32)
    uid: list[str] = []
    rollout_ids: list[str] = []
    span_ids: list[str] = []
    step_index: list[int] = []
    is_pad: list[bool] = []

    for row in range(n_rows):
        t = kept[row % n]
        pad = row >= n
        p, r = len(t.prompt_ids), len(t.response_ids)
        prompts[row, width_p - p :] = torch.tensor(t.prompt_ids, dtype=torch.long)
        prompt_mask[row, width_p - p :] = 1
        responses[row, :r] = torch.tensor(t.response_ids, dtype=torch.long)
        # padding rows keep their tokens (VeRL's no-padding conversion needs real sequences) but no
        # response token of theirs is trained on: response_mask, scores and advantages stay zero
        response_attn[row, :r] = 1
        if t.response_logprobs is not None:
            rollout_logp[row, :r] = torch.tensor(t.response_logprobs, dtype=torch.float32)
        if not pad:
            scores[row, r - 1] = t.return_
            adv[row, :r] = t.advantage
            ret[row, :r] = t.advantage
        uid.append(f"{PAD_UID_PREFIX}{row}" if pad else (t.group_id or t.rollout_id))
        rollout_ids.append(t.rollout_id)
        span_ids.append(t.span_id or "")
        step_index.append(t.step_index)
        is_pad.append(pad)

    response_mask = response_attn.clone()
    response_mask[n:] = 0
    for row, t in enumerate(kept):  # a concatenated rollout trains only its own tokens (lightning_rl.sequences)
        if t.response_mask is not None:
            response_mask[row, : len(t.response_mask)] = torch.tensor(t.response_mask, dtype=response_mask.dtype)
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
    position_ids = torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    tensors: dict[str, torch.Tensor] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "advantages": adv,
        "returns": ret,
    }
    if all(t.response_logprobs is not None for t in kept):
        tensors["rollout_log_probs"] = rollout_logp
    non_tensors: dict[str, Any] = {
        "uid": np.array(uid, dtype=object),
        "rollout_id": np.array(rollout_ids, dtype=object),
        "span_id": np.array(span_ids, dtype=object),
        "step_index": np.array(step_index, dtype=np.int64),
        "is_pad": np.array(is_pad, dtype=bool),
    }
    meta: dict[str, Any] = {
        "temperature": cfg.temperature,
        "global_token_num": attention_mask[:n].sum(dim=-1).tolist(),
    }
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)  # pyright: ignore[reportUnknownMemberType]
    return VerlBatch(data=data, transitions=kept, n_pad_rows=n_rows - n, overlong=overlong, empty=empty)
