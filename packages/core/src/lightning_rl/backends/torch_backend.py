"""The embedded policy backend: one process, CPU or one GPU, plain torch.

``update(transitions)`` runs PPO-clip / GRPO on independent transitions: micro-batches packed by a
token budget, gradients accumulated with per-token weights so the result does not depend on how
the batch was split, one optimizer step per mini-batch, gradient clipping, optional KL to a frozen
reference and optional LoRA. ``publish()`` pushes the new weights to the inference engine and
returns the new model version; every transition records the version that produced it.

Logprobs are always those of the sampling distribution (temperature, top-p) computed by
``lightning_rl.engine.logprobs.sampling_logprobs`` — the same function the engine samples with —
gathered at the sampled tokens (exactly what ``sampled_logprobs`` does).

``update`` also reports two diagnostics: the mean entropy of the sampling distribution per
response token (free: from the logits its first epoch computes anyway) and, with ``track_kl``, the
k3 KL of the policy to the one RL started from (one no-grad forward per update). Entropy
collapsing towards 0, or the KL running away, often shows that a run is going wrong before the
reward does.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lightning_rl.backends.losses import (
    LossAggregation,
    PreferenceLoss,
    kl_k3,
    ppo_clip_loss,
    preference_loss,
    sft_loss,
    token_entropy,
    token_weights,
)
from lightning_rl.engine.logprobs import sampling_logprobs
from lightning_rl.memory import drop_idle_gpu_libraries, release_free_memory
from lightning_rl.types import Transition

__all__ = [
    "TorchBackendConfig",
    "TorchBackend",
    "MicroBatch",
    "pack_micro_batches",
    "cpu_flags",
    "fast_bfloat16",
    "response_logits",
    "shared_prefix_len",
    "save_checkpoint_file",
    "load_checkpoint_file",
    "lora_config",
]

log = logging.getLogger(__name__)

Publisher = Callable[[Mapping[str, torch.Tensor], int], Awaitable[None]]
"""Receives the new state dict and version (e.g. ``engine.load_weights``)."""

SFTCallback = Callable[[int, float, float], None]
"""Called by ``sft`` after each optimizer step with (step index from 0, loss, learning rate)."""


@dataclass
class TorchBackendConfig:
    """Settings of the torch policy backend. Defaults suit a small model on CPU."""

    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 disables)."""
    clip_low: float = 0.2
    """PPO ratio clip below: ``1 - clip_low``."""
    clip_high: float = 0.2
    """PPO ratio clip above: ``1 + clip_high`` (raise it for the asymmetric 'clip-higher' variant)."""
    loss_aggregation: LossAggregation = "token"
    """How token losses are averaged: per token, per transition, or per rollout."""
    old_logprobs: str = "sampled"
    """``sampled``: ratio against the engine's logprobs at sampling time (off-policy aware);
    ``recompute``: against this model's logprobs before the update. With one optimizer step per
    update (``ppo_epochs == 1``, ``mini_batches == 1``) those are the update's own forward pass,
    detached, so recomputing costs nothing; otherwise one no-grad pass over the batch first."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to a frozen copy of the initial model (0 = no reference kept)."""
    track_kl: bool = True
    """Report ``train/kl_to_start``, the k3 KL of the policy to the one RL started from, even when
    ``kl_coef == 0``: how far training has moved the policy is the first thing to check when a run
    collapses or stalls. With ``kl_coef > 0`` the existing reference is reused (no extra cost).
    Otherwise the backend keeps a frozen copy of the weights it has when ``update`` first runs (or
    when ``load_checkpoint`` first replaces them), so a backend used only for ``sft`` copies nothing;
    under LoRA nothing is copied at all (the base model with its adapters disabled is the start).
    Cost: one copy of the parameters in memory (no gradients or optimizer state) and one no-grad
    forward over the batch per update, i.e. about a third of one epoch's forward + backward.
    Measured on the demo model (1.2M parameters, a demo-sized batch of 256 transitions of ~76
    prompt + ~13 response tokens, CPU, 1 thread, CPU time): update 2.45 s -> 3.30 s (+35%, the
    forward alone 0.85 s), 4.6 MB of extra memory; the entropy adds 2-4%. Set False to save the
    copy's memory on a large model, or the forward when updates dominate the step time."""
    ppo_epochs: int = 1
    """Passes over the batch per update."""
    mini_batches: int = 1
    """Optimizer steps per epoch (the batch is split into this many mini-batches)."""
    micro_batch_tokens: int = 16_384
    """Padded tokens per forward pass; bounds memory."""
    temperature: float = 1.0
    """Sampling temperature of the engine; logprobs are computed under the same distribution."""
    top_p: float = 1.0
    device: str = "cpu"
    dtype: str = "float32"
    """Dtype of the weights; logprobs are always computed in float32. With ``lora_rank > 0``,
    ``"bfloat16"`` stores only the frozen base in bfloat16: the adapters, their gradients and the
    optimizer stay float32 (peft keeps adapters in float32), and the output head runs on a float32
    copy of its weights, so no logprob carries bfloat16 rounding of the logits. That halves the
    base's memory and its activations' and runs its matmuls natively where the CPU has AVX512_BF16
    or AMX (``benchmarks/roofline.py``). Pair it with ``old_logprobs="recompute"`` (the engine's
    numbers differ by rounding). Full fine-tuning in bfloat16 keeps bfloat16 master weights, whose
    small updates round away: use ``autocast`` for that instead."""
    autocast: str | None = None
    """``"auto"``: ``"bfloat16"`` where this machine's bfloat16 matmuls are measured faster than
    float32's (``fast_bfloat16``), else ``None``. A CPU without AVX512_BF16 or AMX emulates bfloat16
    and runs it ~60x slower than float32 (0.4 vs 25 GFLOP/s measured on an AVX2 EPYC).
    ``"bfloat16"``: run the decoder body's matmuls in bfloat16 under ``torch.autocast`` while the
    weights, their gradients and the optimizer stay float32, and the output head and the softmax run
    in float32 (a bfloat16 head would put ~0.05 nats of rounding into every logprob). Where ``auto``
    chooses it, a bfloat16 matmul was 3-5x faster (``benchmarks/roofline.py``). The policy then
    differs from a float32 engine by bfloat16 rounding, so pair it with ``old_logprobs="recompute"``:
    the PPO ratio is taken against this backend's own logprobs, not the engine's (the gap between the
    two is measured in tests/core/training/test_autocast.py). ``None``: float32 throughout."""
    lora_rank: int = 0
    """0 trains all weights; > 0 trains LoRA adapters of that rank (needs ``peft``)."""
    lora_alpha: int = 16
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    lora_layers: int | list[int] | None = None
    """Which decoder layers get adapters (PEFT's ``layers_to_transform``): ``None``, every layer; a
    list, those indices; an int ``n``, the top ``n`` layers. Nothing below the lowest adapted layer
    needs a gradient, so the backward pass stops there and the forward below it keeps no
    activations (``benchmarks/update_levers.py`` measures the time and memory on SmolLM2;
    docs/models.md has the demo's learning with it)."""
    kl_every: int = 1
    """With ``track_kl`` (and no ``kl_coef``), measure ``train/kl_to_start`` on every ``kl_every``-th
    update only: it costs a no-grad forward over the batch, about a third of a LoRA update's time
    (``benchmarks/update_levers.py``). The penalty of ``kl_coef > 0`` is always computed."""
    kl_rows: int = 0
    """With ``track_kl`` (and no ``kl_coef``): measure ``train/kl_to_start`` on at most this many
    transitions of the batch, drawn at random per update (seeded by ``seed`` and the step), instead of
    all of them (0). The diagnostic then averages over fewer tokens, an estimate of the same mean,
    and its no-grad forward costs that fraction of a whole pass (the SmolLM2 demo measures 16 of
    ~100: docs/models.md). The penalty of ``kl_coef > 0`` needs every row and ignores this."""
    shared_prefix: int = 0
    """0 runs every sequence whole. ``n > 0``: when the prompts of a micro-batch start with the same
    ``n`` or more tokens (an agent's system prompt and tool list), that prefix is run once, with
    gradient, and its keys/values are shared by every row (``_response_forward``). The result is the
    same computation (logprobs equal to float rounding, tested); the cost falls from rows x (prefix +
    rest) to prefix + rows x rest tokens, which is most of an update when a 300-token tools prompt
    precedes 50-token responses (SmolLM2's calculator: ``benchmarks/smollm2.py``). Rows whose prompts
    differ within their first ``n`` tokens (two agents' requests in one batch) are packed in separate
    micro-batches, so that each agent's prefix is still shared (``pack_micro_batches(group_prefix=n)``)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.old_logprobs not in ("sampled", "recompute"):
            raise ValueError(f"old_logprobs must be 'sampled' or 'recompute', got {self.old_logprobs!r}.")
        if self.ppo_epochs < 1 or self.mini_batches < 1:
            raise ValueError("ppo_epochs and mini_batches must be >= 1.")
        if self.micro_batch_tokens < 1:
            raise ValueError("micro_batch_tokens must be >= 1.")
        if self.shared_prefix < 0:
            raise ValueError("shared_prefix must be >= 0 (0 turns prefix sharing off).")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError("clip_low must be in [0, 1) and clip_high >= 0.")
        if self.autocast not in (None, "auto", "bfloat16", "float16"):
            raise ValueError(f"autocast must be None, 'auto', 'bfloat16' or 'float16', got {self.autocast!r}.")
        if self.autocast == "auto":
            self.autocast = "bfloat16" if fast_bfloat16(self.device) else None
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float16', got {self.dtype!r}.")
        if self.kl_every < 1:
            raise ValueError(f"kl_every must be >= 1 (1 measures the KL at every update), got {self.kl_every}.")
        if isinstance(self.kl_rows, bool) or self.kl_rows < 0:
            raise ValueError(f"kl_rows must be >= 0 (0 measures the KL on every transition), got {self.kl_rows!r}.")
        layers = self.lora_layers
        if isinstance(layers, bool) or (isinstance(layers, int) and layers < 1):
            raise ValueError(f"lora_layers as a number is how many top layers get adapters (>= 1), got {layers!r}.")
        if isinstance(layers, list) and (not layers or any(isinstance(i, bool) or i < 0 for i in layers)):
            raise ValueError(
                f"lora_layers must list layer indices >= 0 (or be the number of top layers), got {layers!r}."
            )


BFLOAT16_MARGIN = 1.25
"""How much faster than float32 a CPU's bfloat16 matmul must measure for ``auto`` to choose it (a
margin, so that a machine where both run alike does not flip between runs)."""


@functools.cache
def fast_bfloat16(device: str = "cpu") -> bool:
    """Whether bfloat16 runs faster than float32 on ``device``: any CUDA device; on a CPU, only when a
    model-sized bfloat16 matmul measures ``BFLOAT16_MARGIN`` times float32's rate or more.

    CPU flags alone do not decide it. Without ``avx512_bf16`` or ``amx_bf16`` (``/proc/cpuinfo``)
    bfloat16 is emulated (~60x slower: 0.4 against 25 GFLOP/s on an AVX2 EPYC), so the answer is no
    without timing. With them it is measured, because the flags do not promise speed: an AVX-512 Intel
    Xeon with AVX512_BF16 and no AMX ran torch's bfloat16 matmuls at 0.5-0.9x its float32 rate (2
    threads; ``benchmarks/roofline.py``), where an AMD EPYC with the same flag ran them 4.7x faster.
    The timing (256 x 576 by 576 x 1,536, a batch through SmolLM2's MLP, best of 3 per precision)
    takes milliseconds, once per process.
    """
    if device.startswith("cuda"):
        return True
    flags = cpu_flags()
    if flags is not None and not flags & {"avx512_bf16", "amx_bf16"}:
        return False  # (not Linux: the timing alone decides; emulated bfloat16 makes it slow, once)
    ratio = _matmul_seconds(torch.float32) / _matmul_seconds(torch.bfloat16)
    fast = ratio >= BFLOAT16_MARGIN
    log.info("bfloat16 matmul at %.2fx float32's rate on this CPU: %s", ratio, "bfloat16" if fast else "float32")
    return fast


def cpu_flags() -> set[str] | None:
    """The words of ``/proc/cpuinfo`` (the CPU flags among them), or None where there is no such file."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(f.read().split())
    except OSError:
        return None


def _matmul_seconds(dtype: torch.dtype) -> float:
    """Best of 3 timings of a 256 x 576 by 576 x 1,536 matmul in ``dtype`` (after a warm-up)."""
    a, b = torch.randn(256, 576).to(dtype), torch.randn(576, 1536).to(dtype)
    torch.mm(a, b)
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return best


@dataclass
class MicroBatch:
    """Right-padded sequences (prompt + response) and per-response-token tensors, flattened."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    prompt_lens: list[int]
    response_lens: list[int]
    indices: list[int]  # positions in the mini-batch
    n_tokens: int


def pack_micro_batches(
    seqs: Sequence[tuple[Sequence[int], Sequence[int]]], budget: int, pad_id: int, *, group_prefix: int = 0
) -> list[MicroBatch]:
    """Group (prompt, response) pairs into right-padded micro-batches of at most ``budget`` padded tokens.

    Sequences are sorted by length first so padding stays small; a sequence longer than the budget
    gets a micro-batch of its own (never truncated). ``group_prefix > 0`` keeps prompts that differ in
    their first ``group_prefix`` tokens in different micro-batches: a batch that mixes two agents'
    requests (a planner's and an answerer's system prompt) then still has one shared prefix per
    micro-batch for ``TorchBackendConfig.shared_prefix`` to run once. When every prompt starts alike
    (one agent) the packing is the same as without it.

    The budget counts every row's prefix although a shared prefix runs once: counting it once would
    fit more rows, but each row still holds the prefix's keys and values (expanded to every query
    head for attention) through the backward pass, so memory grows with rows, not with the tokens
    computed. Measured on the SmolLM2 demo with a 4,096-token budget (seed 0, one thread): with the
    prefix counted once the update's phase peaked at 14.1 GB (``mem/update_peak_gb``), where the
    whole run had peaked at 7.9 GB counting it per row (docs/models.md)."""
    buckets: dict[tuple[int, ...], list[int]] = {}
    for i, (prompt, _) in enumerate(seqs):
        buckets.setdefault(tuple(prompt[:group_prefix]) if group_prefix > 0 else (), []).append(i)
    groups: list[list[int]] = []
    for members in buckets.values():
        order = sorted(members, key=lambda i: len(seqs[i][0]) + len(seqs[i][1]))
        current: list[int] = []
        longest = 0
        for i in order:
            n = len(seqs[i][0]) + len(seqs[i][1])
            if current and max(longest, n) * (len(current) + 1) > budget:
                groups.append(current)
                current, longest = [], 0
            current.append(i)
            longest = max(longest, n)
        if current:
            groups.append(current)
    out: list[MicroBatch] = []
    for idx in groups:
        width = max(len(seqs[i][0]) + len(seqs[i][1]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            full = list(seqs[i][0]) + list(seqs[i][1])
            ids[row, : len(full)] = torch.tensor(full, dtype=torch.long)
            mask[row, : len(full)] = 1
        out.append(
            MicroBatch(
                input_ids=ids,
                attention_mask=mask,
                prompt_lens=[len(seqs[i][0]) for i in idx],
                response_lens=[len(seqs[i][1]) for i in idx],
                indices=idx,
                n_tokens=len(idx) * width,
            )
        )
    return out


class TorchBackend:
    """A trainable causal LM plus its optimizer (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        config: TorchBackendConfig | None = None,
        *,
        pad_token_id: int = 0,
        publisher: Publisher | None = None,
        version: int = 1,
    ) -> None:
        self.config = cfg = config or TorchBackendConfig()
        torch.manual_seed(cfg.seed)
        self.device = torch.device(cfg.device)
        dtype = getattr(torch, cfg.dtype)
        if hasattr(model, "get_base_model"):  # already adapted (a second phase's optimizer): keep float32 adapters
            model = model.to(device=self.device)
        else:
            model = model.to(device=self.device, dtype=dtype)
        self.reference: torch.nn.Module | None = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        # track_kl without a reference: a frozen copy of the starting weights, made lazily (see track_kl)
        self._start: torch.nn.Module | None = None
        if cfg.lora_rank > 0:
            model = _wrap_lora(model, cfg)
        self.model = model
        # a float32 copy of a frozen low-precision head: logits (and so logprobs) without its rounding
        self._head32 = _float32_head(model) if dtype != torch.float32 else None
        self.pad_token_id = pad_token_id
        self.publisher = publisher
        self.version = version
        self.step = 0
        # one stream for every sft() call, so a second phase continues it instead of replaying the first
        self._sft_rng = random.Random(cfg.seed)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        drop_idle_gpu_libraries()  # a model is loaded: the GPU stack it came with is mapped by now

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path,
        config: TorchBackendConfig | None = None,
        *,
        publisher: Publisher | None = None,
        version: int = 1,
    ) -> TorchBackend:
        """Load ``model`` with ``AutoModelForCausalLM`` and wrap it; the pad id comes from its tokenizer.

        ``model`` is anything ``lightning_rl.engine.models.resolve_model`` accepts: an HF folder or Hub
        id, ``tiny``, ``smollm2-135m`` or a ``.gguf`` file (converted once to a cached folder).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lightning_rl.engine.models import resolve_model

        path = resolve_model(model)
        tokenizer: Any = AutoTokenizer.from_pretrained(path)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        policy: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return cls(policy, config, pad_token_id=int(pad or 0), publisher=publisher, version=version)

    # --- forward ------------------------------------------------------------------------------
    def _pack(self, seqs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[MicroBatch]:
        """Micro-batches of ``seqs`` under this backend's token budget; with ``shared_prefix`` set, one
        agent's prompts per micro-batch, so that the prefix they share is run once."""
        cfg = self.config
        return pack_micro_batches(seqs, cfg.micro_batch_tokens, self.pad_token_id, group_prefix=cfg.shared_prefix)

    def _response_logprobs(self, model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
        """Flat logprobs of every response token of the micro-batch, in row order, float32."""
        return self._response_forward(model, mb, entropy=False)[0]

    def _response_forward(
        self, model: torch.nn.Module, mb: MicroBatch, *, entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Flat logprobs of every response token of the micro-batch, in row order, float32, and, if
        ``entropy``, the detached entropy of the sampling distribution at each of those positions.

        The output head is applied only at the positions that predict response tokens: prompts are
        usually far longer than responses, and ``[batch, length, vocab]`` logits of a real vocabulary
        would dominate memory and time. The entropy reuses the distribution the logprobs are
        gathered from, so it costs no forward pass and no second softmax."""
        logits, targets = response_logits(
            model, mb, self.shared_prefix_len(mb), self.device, self._autocast(), head_weight=self._head32
        )
        dist = sampling_logprobs(logits.float(), self.config.temperature, self.config.top_p)
        logp = dist.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        if not entropy:
            return logp, None
        with torch.no_grad():
            return logp, token_entropy(dist.detach())

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` at ``config.autocast`` on this backend's device, or nothing."""
        if self.config.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=getattr(torch, self.config.autocast))

    def shared_prefix_len(self, mb: MicroBatch) -> int:
        """Tokens at the start that every row of ``mb`` shares, if at least ``config.shared_prefix`` (else 0)."""
        return shared_prefix_len(mb, self.config.shared_prefix)

    def logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """This model's logprobs of each transition's response (no gradient), for checks and parity tests."""
        return self._logprobs_of(self.model, transitions)

    def _logprobs_of(self, model: torch.nn.Module, transitions: Sequence[Transition]) -> list[list[float]]:
        seqs = [(t.prompt_ids, t.response_ids) for t in transitions]
        out: list[list[float]] = [[] for _ in transitions]
        with torch.no_grad():
            for mb in self._pack(seqs):
                flat = self._response_logprobs(model, mb).cpu().tolist()
                offset = 0
                for i, r in zip(mb.indices, mb.response_lens, strict=True):
                    out[i] = flat[offset : offset + r]
                    offset += r
        return out

    # --- update -------------------------------------------------------------------------------
    def update(self, transitions: Sequence[Transition]) -> dict[str, float]:
        """One policy update on transitions carrying advantages; returns metrics.

        Besides the loss terms: ``train/entropy``, the mean entropy (nats) of the sampling
        distribution per response token, and, with ``track_kl`` or ``kl_coef > 0``,
        ``train/kl_to_start``, the mean k3 estimate of KL(policy || start) on the sampled tokens.
        Both are measured on the first epoch's forward passes, i.e. on the policy as each
        mini-batch finds it: the first update of a fresh run reports a KL of 0."""
        cfg = self.config
        usable = [t for t in transitions if t.response_ids and t.prompt_ids and t.trained_tokens]
        if not usable:
            raise ValueError("update() got no transition with both prompt and response tokens.")
        if cfg.old_logprobs == "sampled" and any(t.response_logprobs is None for t in usable):
            raise ValueError(
                "old_logprobs='sampled' needs the engine's sampled logprobs on every transition; "
                "record them at the gateway or use old_logprobs='recompute'."
            )
        started = time.perf_counter()
        self.model.train()
        # with one optimizer step per update, the policy before it is the one its only forward pass
        # runs: the recomputed logprobs are that pass's own, detached, and need no pass of their own
        in_pass = cfg.old_logprobs == "recompute" and cfg.ppo_epochs == 1 and cfg.mini_batches == 1
        if in_pass:
            old = [[0.0] * len(t.response_ids) for t in usable]  # filled in from each micro-batch's pass
        elif cfg.old_logprobs == "recompute":
            old = self.logprobs(usable)
        else:
            old = [list(t.response_logprobs or []) for t in usable]
        for t, o in zip(usable, old, strict=True):
            if len(o) != len(t.response_ids):
                raise ValueError(
                    f"transition {t.span_id}: {len(o)} logprobs for {len(t.response_ids)} response tokens."
                )
        start = self._start_logprobs(usable)
        ref: list[list[float]] | None = None
        if cfg.kl_coef > 0 and start is not None:  # the reference's logprobs: every row is measured
            ref = [lp for lp in start if lp is not None]
        totals: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "ratio": 0.0}
        # diagnostics, summed over the response tokens of the first epoch (each token seen once)
        entropy_sum = kl_start_sum = 0.0
        diag_tokens = kl_tokens = 0
        forward_tokens = 0  # padded tokens of every forward pass of the update (what the cost grows with)
        grad_norms: list[float] = []
        n_steps = 0
        rng = random.Random(cfg.seed + self.step)
        for epoch in range(cfg.ppo_epochs):
            order = list(range(len(usable)))
            rng.shuffle(order)
            for chunk in _split(order, cfg.mini_batches):
                batch = [usable[i] for i in chunk]
                # a response_mask leaves context tokens (a spliced tool result) out of the loss and its mean
                weights = token_weights(
                    [t.trained_tokens for t in batch], [t.rollout_id for t in batch], cfg.loss_aggregation
                )
                self.optimizer.zero_grad(set_to_none=True)
                seqs = [(t.prompt_ids, t.response_ids) for t in batch]
                for mb in self._pack(seqs):
                    rows = [chunk[i] for i in mb.indices]
                    forward_tokens += mb.n_tokens
                    logp, entropy = self._response_forward(self.model, mb, entropy=epoch == 0)
                    if in_pass:
                        _fill_rows(old, rows, logp.detach().cpu().tolist())
                    if entropy is not None:
                        trained = torch.tensor(
                            [m for r in rows for m in _mask(usable[r])], dtype=torch.float32, device=self.device
                        )
                        entropy_sum += float((entropy * trained).sum())
                        diag_tokens += int(trained.sum())
                        if start is not None:
                            # rows left out of the measurement (kl_rows) get a placeholder and weight 0
                            start_flat = torch.tensor(
                                [x for r in rows for x in (start[r] or [0.0] * len(usable[r].response_ids))],
                                dtype=torch.float32,
                                device=self.device,
                            )
                            measured = trained * torch.tensor(
                                [float(start[r] is not None) for r in rows for _ in usable[r].response_ids],
                                dtype=torch.float32,
                                device=self.device,
                            )
                            # a token outside both nuclei (top-p) has logprob -inf on each side: no KL there
                            kl = torch.nan_to_num(kl_k3(logp.detach(), start_flat), nan=0.0)
                            kl_start_sum += float((kl * measured).sum())
                            kl_tokens += int(measured.sum())
                    flat = _flat(
                        [old[r] for r in rows],
                        [[usable[r].advantage] * len(usable[r].response_ids) for r in rows],
                        [[weights[i] * m for m in _mask(batch[i])] for i in mb.indices],
                        [ref[r] for r in rows] if ref is not None else None,
                        self.device,
                    )
                    terms = ppo_clip_loss(
                        logp,
                        flat["old"],
                        flat["adv"],
                        flat["w"],
                        clip_low=cfg.clip_low,
                        clip_high=cfg.clip_high,
                        ref_logprobs=flat.get("ref"),
                        kl_coef=cfg.kl_coef,
                    )
                    terms.loss.backward()  # pyright: ignore[reportUnknownMemberType]
                    for key in totals:
                        totals[key] += float(getattr(terms, key).detach()) / (cfg.ppo_epochs * cfg.mini_batches)
                grad_norms.append(self._clip_and_step())
                n_steps += 1
        self.step += 1
        release_free_memory()  # the update's activations, freed: back to the system (see lightning_rl.memory)
        elapsed = time.perf_counter() - started
        n_tokens = sum(t.trained_tokens for t in usable)
        diagnostics = {"train/entropy": entropy_sum / diag_tokens}
        if start is not None:
            diagnostics["train/kl_to_start"] = kl_start_sum / kl_tokens if kl_tokens else float("nan")
        return {
            **{f"train/{k}": v for k, v in totals.items()},
            **diagnostics,
            "train/grad_norm": sum(grad_norms) / len(grad_norms),
            "train/optimizer_steps": float(n_steps),
            "train/update_s": elapsed,
            "train/update_tokens_per_s": n_tokens * cfg.ppo_epochs / elapsed if elapsed > 0 else 0.0,
            "train/sequence_tokens": float(sum(len(t.prompt_ids) + len(t.response_ids) for t in usable)),
            "train/forward_tokens": float(forward_tokens),
        }

    def sft(
        self,
        examples: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        steps: int,
        batch_size: int,
        warmup_steps: int = 0,
        final_lr_fraction: float = 1.0,
        lr: float | None = None,
        on_step: SFTCallback | None = None,
    ) -> list[float]:
        """Supervised warm-start on (prompt ids, response ids) pairs; returns the loss per step.

        The learning rate (``lr``, default the configured one) warms up linearly for ``warmup_steps``,
        then follows a cosine down to ``final_lr_fraction`` of it (1.0 keeps it constant). Calls
        share the optimizer state and the batch sampler (seeded once per backend, saved in
        checkpoints), so a later phase continues smoothly from an earlier one and draws new
        batches instead of replaying the earlier phase's. ``on_step(step, loss, lr)`` runs after each optimizer
        step, for callers that show progress."""
        if not examples:
            raise ValueError("sft() needs at least one example.")
        rng = self._sft_rng
        losses: list[float] = []
        self.model.train()
        base_lr = self.config.lr if lr is None else lr
        for step in range(steps):
            if step < warmup_steps:
                lr = base_lr * (step + 1) / warmup_steps
            else:
                progress = (step - warmup_steps) / max(steps - warmup_steps, 1)
                lr = base_lr * (final_lr_fraction + (1 - final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
            weights = token_weights([len(r) for _, r in batch], [str(i) for i in range(len(batch))], "token")
            self.optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for mb in self._pack(batch):
                logp = self._response_logprobs(self.model, mb)
                w = torch.tensor(
                    [weights[i] for k, i in enumerate(mb.indices) for _ in range(mb.response_lens[k])],
                    device=self.device,
                )
                loss = sft_loss(logp, w)
                loss.backward()  # pyright: ignore[reportUnknownMemberType]
                total += float(loss.detach())
            self._clip_and_step()
            losses.append(total)
            if on_step is not None:
                on_step(step, total, lr)
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr
        release_free_memory()
        return losses

    def preference_update(
        self,
        pairs: Sequence[tuple[Sequence[Transition], Sequence[Transition]]],
        *,
        beta: float = 0.1,
        loss: PreferenceLoss = "sigmoid",
        length_normalize: bool = False,
    ) -> dict[str, float]:
        """One DPO / IPO update on (chosen, rejected) pairs; the reference is the frozen start policy.

        Each side of a pair is one or more transitions (one LLM call, or every call of a rollout); its
        sequence logprob is the sum over their response tokens, divided by that token count with
        ``length_normalize``. The reference logprobs come from the policy RL started from: the
        ``kl_coef`` reference if there is one, else the frozen copy ``track_kl`` keeps (made now if not
        yet), or under LoRA the base model with its adapters off. ``ppo_epochs`` passes over the pairs,
        ``mini_batches`` optimizer steps per pass, as in ``update``.

        Gradient accumulation is exact whatever the micro-batching: the loss is a function of per-pair
        sums, so a no-grad forward first gives each pair's ``dloss/dlogp`` (and the metrics), then a
        forward with gradient over the micro-batches backpropagates ``sum(coefficient * logp)``, whose
        gradient is the loss's. That costs one no-grad forward per mini-batch but never holds more than
        one micro-batch's activations. A pair whose logprobs are not finite (a token outside the top-p
        nucleus) is skipped and counted in ``train/dpo_skipped_pairs``.

        Metrics: ``train/loss``, ``train/dpo_margin`` (chosen minus rejected log-ratio to the reference,
        before ``beta``), ``train/dpo_accuracy`` (pairs with a positive margin), the chosen and rejected
        log-ratios, ``train/kl_to_start`` and ``train/entropy`` per response token, ``train/grad_norm``.
        The margin and accuracy are measured on the policy as each mini-batch finds it."""
        cfg = self.config
        if not pairs:
            raise ValueError("preference_update() got no pairs; build them with lightning_rl.algorithms.dpo.")
        index: dict[int, int] = {}
        unique: list[Transition] = []
        sides: list[tuple[list[int], list[int]]] = []
        for chosen, rejected in pairs:
            rows: list[list[int]] = []
            for side in (chosen, rejected):
                if not side:
                    raise ValueError("every pair needs at least one chosen and one rejected transition.")
                row: list[int] = []
                for t in side:
                    if not t.prompt_ids or not t.response_ids:
                        raise ValueError(
                            f"transition {t.span_id}: a pair's transitions need prompt and response tokens."
                        )
                    row.append(index.setdefault(id(t), len(unique)))
                    if row[-1] == len(unique):
                        unique.append(t)
                rows.append(row)
            sides.append((rows[0], rows[1]))
        started = time.perf_counter()
        self.model.train()
        ref = self._frozen_start_logprobs(unique)
        ref_sum = [math.fsum(r) for r in ref]
        lengths = [len(t.response_ids) for t in unique]

        def norm(side: list[int]) -> float:
            return float(sum(lengths[i] for i in side)) if length_normalize else 1.0

        totals = {"loss": 0.0, "dpo_margin": 0.0, "dpo_accuracy": 0.0, "dpo_chosen_logratio": 0.0}
        totals["dpo_rejected_logratio"] = 0.0
        entropy_sum = kl_sum = 0.0
        diag_tokens = kl_tokens = skipped = n_steps = 0
        grad_norms: list[float] = []
        rng = random.Random(cfg.seed + self.step)
        for epoch in range(cfg.ppo_epochs):
            order = list(range(len(sides)))
            rng.shuffle(order)
            for chunk in _split(order, cfg.mini_batches):
                members = sorted({i for p in chunk for i in (*sides[p][0], *sides[p][1])})
                now = dict(zip(members, self._logprobs_of(self.model, [unique[i] for i in members]), strict=True))
                if epoch == 0:  # KL to the start on each transition of this pass, as the policy finds it
                    for i in members:
                        k3 = kl_k3(torch.tensor(now[i]), torch.tensor(ref[i]))
                        kl_sum += float(torch.nan_to_num(k3, nan=0.0, posinf=0.0).sum())
                        kl_tokens += lengths[i]
                now_sum = {i: math.fsum(v) for i, v in now.items()}
                live = [
                    p
                    for p in chunk
                    if all(
                        math.isfinite(now_sum[i]) and math.isfinite(ref_sum[i]) for i in (*sides[p][0], *sides[p][1])
                    )
                ]
                if epoch == 0:
                    skipped += len(chunk) - len(live)
                if not live:
                    continue
                policy_c = _side_sums(now_sum, sides, live, 0, norm).requires_grad_(True)
                policy_r = _side_sums(now_sum, sides, live, 1, norm).requires_grad_(True)
                weights = torch.full((len(live),), 1.0 / len(live), dtype=torch.float64)
                terms = preference_loss(
                    policy_c,
                    policy_r,
                    _side_sums(ref_sum, sides, live, 0, norm),
                    _side_sums(ref_sum, sides, live, 1, norm),
                    weights,
                    beta=beta,
                    loss=loss,
                )
                terms.loss.backward()  # pyright: ignore[reportUnknownMemberType]
                assert policy_c.grad is not None and policy_r.grad is not None
                coef: dict[int, float] = {}
                for k, p in enumerate(live):
                    for which, grad in ((0, policy_c.grad), (1, policy_r.grad)):
                        for i in sides[p][which]:
                            coef[i] = coef.get(i, 0.0) + float(grad[k]) / norm(sides[p][which])
                scale = 1.0 / (cfg.ppo_epochs * cfg.mini_batches)
                totals["loss"] += float(terms.loss.detach()) * scale
                totals["dpo_margin"] += float(terms.margin) * scale
                totals["dpo_accuracy"] += float(terms.accuracy) * scale
                totals["dpo_chosen_logratio"] += float(terms.chosen) * scale
                totals["dpo_rejected_logratio"] += float(terms.rejected) * scale
                # the same gradient, micro-batch by micro-batch: d(sum coef * logp) = sum dloss/dlogp * dlogp
                self.optimizer.zero_grad(set_to_none=True)
                trained = [i for i in members if coef.get(i, 0.0) != 0.0]
                seqs = [(unique[i].prompt_ids, unique[i].response_ids) for i in trained]
                for mb in self._pack(seqs):
                    logp, entropy = self._response_forward(self.model, mb, entropy=epoch == 0)
                    if entropy is not None:
                        entropy_sum += float(entropy.sum())
                        diag_tokens += entropy.numel()
                    w = torch.tensor(
                        [coef[trained[j]] for j, r in zip(mb.indices, mb.response_lens, strict=True) for _ in range(r)],
                        dtype=torch.float32,
                        device=self.device,
                    )
                    (w * logp).sum().backward()  # pyright: ignore[reportUnknownMemberType]
                grad_norms.append(self._clip_and_step())
                n_steps += 1
        self.step += 1
        elapsed = time.perf_counter() - started
        return {
            **{f"train/{k}": v for k, v in totals.items()},
            "train/dpo_skipped_pairs": float(skipped),
            "train/entropy": entropy_sum / diag_tokens if diag_tokens else float("nan"),
            "train/kl_to_start": kl_sum / kl_tokens if kl_tokens else float("nan"),
            "train/grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else 0.0,
            "train/optimizer_steps": float(n_steps),
            "train/update_s": elapsed,
        }

    # --- weights ------------------------------------------------------------------------------
    def state_dict_for_inference(self) -> dict[str, torch.Tensor]:
        """Full weights under the base model's parameter names (LoRA merged), detached copies on CPU."""
        model = self.model
        if self.config.lora_rank > 0:
            return _merged_lora_state(model)
        return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    async def publish(self) -> int:
        """Send the current weights to the inference engine; returns the new model version."""
        self.version += 1
        if self.publisher is not None:
            await self.publisher(self.state_dict_for_inference(), self.version)
        return self.version

    def save_checkpoint(self, directory: str | Path) -> Path:
        """Weights, optimizer state, step and version, enough to resume exactly.

        Written to a temporary file, flushed to disk and renamed over ``policy.pt``, so a process
        killed mid-save leaves the previous checkpoint whole: the trainer saves the last step twice
        (in the loop and at the end), and a kill during the second save used to leave the file the
        ``latest`` marker names truncated, a run that could never resume (found by benchmarks/chaos.py).
        """
        return save_checkpoint_file(
            directory,
            {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "step": self.step,
                "version": self.version,
                "config": asdict(self.config),
                "torch_rng": torch.get_rng_state(),
                "sft_rng": self._sft_rng.getstate(),
            },
        )

    def load_checkpoint(self, directory: str | Path) -> None:
        state = load_checkpoint_file(directory, self.device)
        self._snapshot_start()  # the start is what these weights were, not what the checkpoint holds
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        self.version = int(state["version"])
        torch.set_rng_state(state["torch_rng"])
        if "sft_rng" in state:  # checkpoints written before the sampler was saved lack it
            self._sft_rng.setstate(state["sft_rng"])

    # --- internals ----------------------------------------------------------------------------
    def _start_logprobs(self, transitions: Sequence[Transition]) -> list[list[float] | None] | None:
        """Logprobs under the starting policy (no gradient), or None when KL is not tracked; with
        ``kl_rows``, None in place of each transition left out of the measurement.

        The ``kl_coef`` reference serves both the penalty and the diagnostic; otherwise the frozen
        copy of ``track_kl``, or, under LoRA, the model with its adapters off (the adapters start
        as a no-op, so the base model is exactly the starting policy)."""
        if self.reference is not None:  # the penalty's reference: every row
            return [*self._logprobs_of(self.reference, transitions)]
        if not self.config.track_kl:
            return None
        self._snapshot_start()  # at the first update, measured or not: it is the start
        if (self.step + 1) % self.config.kl_every:
            return None
        rows = list(range(len(transitions)))
        if 0 < self.config.kl_rows < len(rows):
            rows = sorted(random.Random(self.config.seed * 1_000_003 + self.step).sample(rows, self.config.kl_rows))
        measured = self._frozen_start_logprobs([transitions[i] for i in rows])  # the same start, no copy made
        out: list[list[float] | None] = [None] * len(transitions)
        for i, lp in zip(rows, measured, strict=True):
            out[i] = lp
        return out

    def _frozen_start_logprobs(self, transitions: Sequence[Transition]) -> list[list[float]]:
        """Logprobs under the starting policy whatever ``track_kl`` says (DPO's reference needs one).

        The same policy ``_start_logprobs`` uses, so ``train/kl_to_start`` and DPO agree on "the start";
        without ``track_kl`` the frozen copy is made on first use (after a resume: of the resumed weights)."""
        if self.reference is not None:
            return self._logprobs_of(self.reference, transitions)
        if self.config.lora_rank > 0:
            with self.model.disable_adapter():  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportCallIssue]
                return self._logprobs_of(self.model, transitions)
        if self._start is None:
            self._start = copy.deepcopy(self.model).eval().requires_grad_(False)
        return self._logprobs_of(self._start, transitions)

    def _snapshot_start(self) -> None:
        """Freeze a copy of the current weights as the starting policy, once (see ``track_kl``)."""
        if self._start is None and self.reference is None and self.config.track_kl and self.config.lora_rank == 0:
            self._start = copy.deepcopy(self.model).eval().requires_grad_(False)

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.config.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        else:
            norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params if p.grad is not None))
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            log.warning("skipping optimizer step: gradient norm is %s", norm)
        return norm


def save_checkpoint_file(directory: str | Path, state: Mapping[str, Any]) -> Path:
    """``torch.save`` ``state`` as ``directory/policy.pt``, atomically: written aside, flushed to disk,
    then renamed over the old file, so a kill mid-save leaves the previous checkpoint whole."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    partial = path / "policy.pt.partial"
    torch.save(dict(state), partial)
    with partial.open("rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(partial, path / "policy.pt")
    return path / "policy.pt"


def load_checkpoint_file(directory: str | Path, device: torch.device) -> dict[str, Any]:
    """What ``save_checkpoint_file`` wrote in ``directory``; a clear error when there is none."""
    path = Path(directory) / "policy.pt"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}; pass the folder a previous run saved.")
    state: dict[str, Any] = torch.load(path, map_location=device, weights_only=False)
    return state


def _fill_rows(out: list[list[float]], rows: Sequence[int], flat: Sequence[float]) -> None:
    """Write a micro-batch's flat per-token values back to its rows (``out[row]`` already has their length)."""
    offset = 0
    for row in rows:
        n = len(out[row])
        out[row] = list(flat[offset : offset + n])
        offset += n


def _mask(t: Transition) -> list[int]:
    """Which of ``t``'s response tokens are trained: its ``response_mask``, or all of them."""
    return t.response_mask if t.response_mask is not None else [1] * len(t.response_ids)


def _split(order: list[int], parts: int) -> Iterator[list[int]]:
    size = math.ceil(len(order) / parts)
    for start in range(0, len(order), size):
        yield order[start : start + size]


def _side_sums(
    values: Sequence[float] | Mapping[int, float],
    sides: Sequence[tuple[list[int], list[int]]],
    pairs: Sequence[int],
    which: int,
    norm: Callable[[list[int]], float],
) -> torch.Tensor:
    """Per pair of ``pairs``: the summed sequence logprob of side ``which`` (0 chosen, 1 rejected), normalised."""
    return torch.tensor(
        [sum(values[i] for i in sides[p][which]) / norm(sides[p][which]) for p in pairs], dtype=torch.float64
    )


def _flat(
    old: list[list[float]],
    adv: list[list[float]],
    w: list[list[float]],
    ref: list[list[float]] | None,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    def cat(rows: list[list[float]]) -> torch.Tensor:
        return torch.tensor([x for row in rows for x in row], dtype=torch.float32, device=device)

    out = {"old": cat(old), "adv": cat(adv), "w": cat(w)}
    if ref is not None:
        out["ref"] = cat(ref)
    return out


def _wrap_lora(model: torch.nn.Module, cfg: TorchBackendConfig) -> torch.nn.Module:
    try:
        from peft import get_peft_model  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        raise ImportError("LoRA needs peft: pip install 'lightning-rl[lora]'") from exc
    return get_peft_model(model, lora_config(cfg, model))  # pyright: ignore[reportUnknownVariableType]


def lora_config(cfg: TorchBackendConfig, model: torch.nn.Module) -> Any:
    """PEFT's ``LoraConfig`` for ``cfg``'s rank, alpha, targets and layers (``lora_layers`` resolved
    against ``model``'s depth)."""
    from peft import LoraConfig  # pyright: ignore[reportMissingImports]

    layers = cfg.lora_layers
    if isinstance(layers, int):
        depth = int(getattr(getattr(model, "config", None), "num_hidden_layers", 0) or 0)
        if not depth:
            raise ValueError(
                "lora_layers as a number needs a model whose config has num_hidden_layers; list the layers."
            )
        layers = list(range(max(depth - layers, 0), depth))
    return LoraConfig(  # pyright: ignore[reportUnknownVariableType]
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        target_modules=cfg.lora_targets,
        lora_dropout=0.0,
        layers_to_transform=layers,
    )


def _merged_lora_state(model: Any) -> dict[str, torch.Tensor]:
    """The base weights with the adapters merged, named as the base model names them.

    Computed beside the model, never in place: peft's ``merge_adapter`` / ``unmerge_adapter`` adds
    and subtracts the adapter product in the weights' own dtype, which leaves rounding behind in
    the base weights every publish (in bfloat16, a visible drift after a few steps). Each adapted
    weight is ``W + scaling * B @ A`` in float32; weights no adapter touches are passed as they
    are, not copied (a publisher copies or saves them before returning, and the update waits for
    it), so a publish allocates only the adapted layers' merged copies."""
    from peft.tuners.lora import LoraLayer  # pyright: ignore[reportMissingImports]

    base: Any = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            layer: Any = module
            total: torch.Tensor = layer.get_base_layer().weight.detach().float()
            for adapter in layer.active_adapters:
                total = total + layer.get_delta_weight(adapter).float()
            merged[f"{name}.weight"] = total.to("cpu")
    out: dict[str, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = base.state_dict()
    for key, value in state.items():
        if "lora_" in key:
            continue
        name = key.replace(".base_layer.", ".")
        out[name] = merged[name] if name in merged else value.detach()
    return out


def _float32_head(model: Any) -> torch.Tensor | None:
    """A float32 copy of ``model``'s output head weight when it is frozen and stored in lower
    precision (a LoRA model on a bfloat16 base), else None: its logits then carry no bfloat16
    rounding (~0.05 nats at SmolLM2's logit scale) for the price of one float32 copy of the head."""
    split = _split_head(model)
    if split is None:
        return None
    head = split[1]
    if hasattr(head, "base_layer"):  # an adapted head (lm_head in lora_targets): its logits change
        return None
    weight: torch.Tensor = head.weight
    if weight.requires_grad or weight.dtype == torch.float32:
        return None
    return weight.detach().float()


def _dynamic_cache(model: Any) -> Any:
    """An empty key/value cache for ``model`` (transformers' ``DynamicCache``, sized from its config)."""
    from transformers import DynamicCache

    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return DynamicCache(config=model.config)


def shared_prefix_len(mb: MicroBatch, minimum: int) -> int:
    """Tokens at the start that every row of ``mb`` shares, if at least ``minimum`` (else 0; and 0
    when ``minimum <= 0``: sharing off).

    At most the shortest prompt minus one token: the position that predicts a row's first response
    token must be in the part each row runs itself."""
    if minimum <= 0 or mb.input_ids.shape[0] < 2:
        return 0
    limit = min(mb.prompt_lens) - 1
    if limit < minimum:
        return 0
    ids = mb.input_ids[:, :limit]
    same = (ids == ids[:1]).all(dim=0)
    differ = (~same).nonzero()
    n = int(differ[0, 0]) if differ.numel() else limit
    return n if n >= minimum else 0


def response_logits(
    model: Any,
    mb: MicroBatch,
    shared: int = 0,
    device: torch.device | None = None,
    autocast: contextlib.AbstractContextManager[Any] | None = None,
    *,
    head_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits at every position that predicts a response token, those tokens), flat in row order:
    ``[sum(response_lens), vocab]`` and ``[sum(response_lens)]``. Gradients flow when enabled.

    The output head is applied only at those positions: prompts are usually far longer than
    responses, and ``[batch, length, vocab]`` logits of a real vocabulary would dominate memory and
    time (300 x 49,152 floats, 59 MB, per row of a SmolLM2 tools prompt). With ``shared > 0`` the
    first ``shared`` tokens, which every row has in common, run once (batch 1) and their keys and
    values are repeated for every row; the rest of each row runs on top of them. Under ``autocast``
    the body runs in its precision and the head, outside it, in the weights' own; ``head_weight``
    (a float32 copy of a frozen head's weight) computes the logits in float32 from the body's output."""
    device = device or mb.input_ids.device
    ids = mb.input_ids.to(device)
    mask = mb.attention_mask.to(device)
    rows = torch.tensor(
        [row for row, r in enumerate(mb.response_lens) for _ in range(r)], dtype=torch.long, device=device
    )
    # hidden state at position j predicts token j + 1
    cols = torch.tensor(
        [p - 1 + k for p, r in zip(mb.prompt_lens, mb.response_lens, strict=True) for k in range(r)],
        dtype=torch.long,
        device=device,
    )
    split = _split_head(model)
    hidden: torch.Tensor | None = None  # the body's output at the predicting positions (split head)
    logits: torch.Tensor | None = None  # or the whole model's logits there
    with autocast or contextlib.nullcontext():
        if shared:
            # positions continue from the prefix's length: the rest attends to the prefix's keys/values
            cache: Any = _dynamic_cache(model)
            runner = split[0] if split is not None else model
            runner(input_ids=ids[:1, :shared], past_key_values=cache, use_cache=True)
            cache.batch_repeat_interleave(ids.shape[0])
            rest = runner(input_ids=ids[:, shared:], attention_mask=mask, past_key_values=cache, use_cache=True)
            if split is not None:
                hidden = rest.last_hidden_state[rows, cols - shared]
            else:
                logits = rest.logits[rows, cols - shared]
        elif split is not None:
            hidden = split[0](input_ids=ids, attention_mask=mask).last_hidden_state[rows, cols]
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits[rows, cols]
    if hidden is not None and split is not None:
        head = split[1]
        if head_weight is not None and getattr(head, "bias", None) is None:
            logits = torch.nn.functional.linear(hidden.to(head_weight.dtype), head_weight)
        else:
            logits = head(hidden.to(head.weight.dtype))
    assert logits is not None
    return logits, ids[rows, cols + 1]


def _split_head(model: Any) -> tuple[Any, Any] | None:
    """The decoder body and output head of an HF causal LM (``model.model`` / ``lm_head``), if it has them.

    Models that scale or soft-cap their logits inside ``forward`` (``logit_scale``, final soft-capping)
    are run whole instead, so the logprobs match what the engine samples from."""
    if hasattr(model, "get_base_model"):  # a peft wrapper: its LoRA layers live inside the base model's modules
        model = model.get_base_model()
    config = getattr(model, "config", None)
    if config is None or getattr(config, "final_logit_softcapping", None) or getattr(model, "logit_scale", None):
        return None
    body = getattr(model, "model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if body is None or head is None or not callable(body):
        return None
    return body, head
