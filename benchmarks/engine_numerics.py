"""How far the embedded engine's batched logprobs are from one-at-a-time and full-forward logprobs.

The engine decodes many sequences in one left-padded batch (``engine._batch.KVBatch``); a trainer
recomputes the same logprobs from one unpadded full-sequence forward pass. In exact arithmetic all
agree: padding is masked out and rotary positions come from the mask. In float32 they differ by
rounding, because the same numbers go through matmuls and attention reductions of other shapes (a
``[B, h] x [h, V]`` product is blocked differently for each ``B``; attention reduces over the padded
width; kernels and their split over threads change with the shape). A batch of one is bit-identical
to a sequence alone. The engine tests take their tolerances from this measurement
(``tests/core/engine/numerics.py``).

For each torch thread count and batch size ``B`` (``1..--max-batch``), ``B`` prompts of 9 to 38
tokens are prefilled together and decoded for ``--steps`` tokens, teacher-forced with the tokens each
prompt sampled alone (temperature 0.8, top-p 0.95), so every run sees the same sequences. Columns,
for batched against one at a time (``vs sequential``) and against the full forward pass (``vs full``),
maxima over rows and positions:

* ``logits``: max |difference| of the raw logits;
* ``logprob p=1``: max |difference| of ``sampling_logprobs`` (temperature 0.8, top-p 1) over the
  whole vocabulary: what a logprob tolerance must cover;
* ``logprob p<1``: the same at top-p 0.95, over tokens kept by both, at positions with the same nucleus;
* ``cut mass``: max |difference| of the probability mass before the k-th most likely token, over
  ranks k: how far rounding moves the top-p cut (a token is kept iff that mass is ``< top_p``);
* ``nucleus flips``: positions whose top-p 0.95 nucleus differs (a token within ``cut mass`` of the
  cut fell on the other side), and how many distinct (row, step) they are: a row is in every larger
  batch too; at a flip every kept token's logprob moves by about that token's probability
  (``flip jump``), far more than rounding;
* ``tokens differ``: the expected number of sampled tokens that would differ, summed over positions.
  The engine draws one uniform ``u`` per token and inverts the CDF; both sides pick the same token
  ``i`` iff ``u`` lies in both ``[F_{i-1}, F_i)`` and ``[F'_{i-1}, F'_i)``, so the chance they differ
  is one minus the sum of those overlaps.

``all`` rows fold every batch size together (each row of each batch is a separate computation). A
last line compares one-at-a-time runs under the first and the other thread counts.

    uv run python benchmarks/engine_numerics.py [--max-batch 64] [--steps 20] [--threads 1 2] [--every 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_rl.engine import sampling_logprobs
from lightning_rl.engine._batch import KVBatch
from lightning_rl.engine.tiny import default_tiny_model

__all__ = ["main"]

_WORDS = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
_TEMPERATURE = 0.8
_TOP_P = 0.95


def _cpu_name() -> str:
    """The CPU's model name (Linux), else the machine type: rounding depends on the kernels it runs."""
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def _prompts(tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` chat prompts of 1 to 15 words (so rows carry different amounts of left padding)."""
    out: list[list[int]] = []
    for i in range(count):
        words = _WORDS[i % len(_WORDS) : i % len(_WORDS) + 1 + (7 * i) % len(_WORDS)]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": " ".join(words) or "hi"}], add_generation_prompt=True, tokenize=False
        )
        out.append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


def _sample(logits: torch.Tensor, generator: torch.Generator) -> int:
    logp = sampling_logprobs(logits, _TEMPERATURE, _TOP_P)
    return int(torch.multinomial(logp.exp(), 1, generator=generator))


def _run_batch(
    model: Any, pad_id: int, prompts: Sequence[Sequence[int]], forced: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Logits ``[B, steps, V]`` of ``prompts`` decoded together, feeding ``forced`` tokens."""
    batch = KVBatch(model, pad_id, torch.device("cpu"))
    steps = len(forced[0])
    out = [batch.prefill(prompts)]
    for step in range(steps - 1):
        out.append(batch.decode([row[step] for row in forced]))
    return torch.stack(out, dim=1).float()


def _sampled_tokens(model: Any, pad_id: int, prompts: Sequence[Sequence[int]], steps: int) -> list[list[int]]:
    """The tokens each prompt samples when decoded alone (row ``i`` seeded with ``i``)."""
    tokens: list[list[int]] = []
    for i, prompt in enumerate(prompts):
        generator = torch.Generator().manual_seed(i)
        batch = KVBatch(model, pad_id, torch.device("cpu"))
        sampled = [_sample(batch.prefill([prompt])[0], generator)]
        for _ in range(steps - 1):
            sampled.append(_sample(batch.decode([sampled[-1]])[0], generator))
        tokens.append(sampled)
    return tokens


def _full_forward(model: Any, prompts: Sequence[Sequence[int]], forced: Sequence[Sequence[int]]) -> torch.Tensor:
    """What a trainer computes: one unpadded forward pass per sequence, logits that predict ``forced``."""
    rows = []
    for prompt, completion in zip(prompts, forced, strict=True):
        logits = model(torch.tensor([[*prompt, *completion]])).logits[0]
        rows.append(logits[len(prompt) - 1 : len(prompt) + len(completion) - 1])
    return torch.stack(rows).float()


def _linear_rows(model: Any, sizes: Sequence[int]) -> list[tuple[int, float]]:
    """Max |F.linear of ``B`` rows at once - the same rows one at a time| through the output head.

    The smallest case of what differs between a batch and a request alone: one matmul, no padding, no
    attention (random hidden states, the model's real weights).
    """
    weight = model.get_output_embeddings().weight
    hidden = torch.randn(max(sizes), weight.shape[1], generator=torch.Generator().manual_seed(0))
    alone = torch.cat([torch.nn.functional.linear(hidden[i : i + 1], weight) for i in range(max(sizes))])
    return [(b, float((torch.nn.functional.linear(hidden[:b], weight) - alone[:b]).abs().max())) for b in sizes]


def _disagreement(logp_a: torch.Tensor, logp_b: torch.Tensor) -> torch.Tensor:
    """Per position, the probability that inverse-CDF sampling picks different tokens from the two.

    The engine draws one uniform ``u`` and takes the first token whose normalised CDF exceeds it.
    Both sides pick token ``i`` exactly when ``u`` lies in both ``[F_{i-1}, F_i)`` and
    ``[F'_{i-1}, F'_i)``, so the probability that they agree is the sum of those overlaps.
    """
    cdf_a, cdf_b = logp_a.double().exp().cumsum(-1), logp_b.double().exp().cumsum(-1)
    cdf_a, cdf_b = cdf_a / cdf_a[:, -1:], cdf_b / cdf_b[:, -1:]
    lower_a, lower_b = torch.nn.functional.pad(cdf_a, (1, 0))[:, :-1], torch.nn.functional.pad(cdf_b, (1, 0))[:, :-1]
    overlap = (torch.minimum(cdf_a, cdf_b) - torch.maximum(lower_a, lower_b)).clamp(min=0)
    return (1 - overlap.sum(-1)).clamp(min=0)


def _mass_before(logits: torch.Tensor) -> torch.Tensor:
    """The probability mass before the k-th most likely token, for every rank k (step 3 of
    ``sampling_logprobs`` at temperature 0.8): the nucleus is the ranks where this is below ``top_p``."""
    sorted_logp = torch.sort(sampling_logprobs(logits, _TEMPERATURE), dim=-1, descending=True).values
    return torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()


@dataclass
class Diff:
    """Maxima of the differences between two ``[..., V]`` logit tensors (see the module docstring)."""

    logits: float = 0.0
    logprob_full: float = 0.0
    logprob_nucleus: float = 0.0
    flips: int = 0
    flip_jump: float = 0.0
    token_differs: float = 0.0
    cut_mass: float = 0.0
    positions: int = 0
    flipped: set[tuple[int, int]] = field(default_factory=set[tuple[int, int]])
    """(row, step) of the flips: the same row sits in every larger batch, so a flip often repeats."""

    def add(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Compare ``[rows, steps, V]`` logits ``a`` with ``b``."""
        steps = a.shape[1]
        a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
        self.positions += a.shape[0]
        self.logits = max(self.logits, float((a - b).abs().max()))
        full_a, full_b = sampling_logprobs(a, _TEMPERATURE), sampling_logprobs(b, _TEMPERATURE)
        self.logprob_full = max(self.logprob_full, float((full_a - full_b).abs().max()))
        nuc_a, nuc_b = sampling_logprobs(a, _TEMPERATURE, _TOP_P), sampling_logprobs(b, _TEMPERATURE, _TOP_P)
        kept_a, kept_b = nuc_a.isfinite(), nuc_b.isfinite()
        same = (kept_a == kept_b).all(-1)
        both = kept_a & kept_b
        gap = torch.where(both, (nuc_a - nuc_b).abs(), torch.zeros_like(nuc_a)).amax(-1)
        if bool(same.any()):
            self.logprob_nucleus = max(self.logprob_nucleus, float(gap[same].max()))
        if bool((~same).any()):
            self.flips += int((~same).sum())
            self.flipped.update(divmod(int(i), steps) for i in (~same).nonzero()[:, 0])
            self.flip_jump = max(self.flip_jump, float(gap[~same].max()))
        self.token_differs += float(_disagreement(nuc_a, nuc_b).sum())
        self.cut_mass = max(self.cut_mass, float((_mass_before(a) - _mass_before(b)).abs().max()))

    def merge(self, other: Diff) -> None:
        """Fold in ``other``'s maxima and counts."""
        for name in ("logits", "logprob_full", "logprob_nucleus", "flip_jump", "cut_mass"):
            setattr(self, name, max(getattr(self, name), getattr(other, name)))
        self.flips += other.flips
        self.flipped |= other.flipped
        self.token_differs += other.token_differs
        self.positions += other.positions

    def cells(self) -> str:
        return (
            f"{self.logits:.1e} | {self.logprob_full:.1e} | {self.logprob_nucleus:.1e} | {self.cut_mass:.1e} | "
            f"{self.flips}/{self.positions} ({len(self.flipped)} distinct) | {self.flip_jump:.1e} | "
            f"{self.token_differs:.1e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="tokens per sequence (prefill + steps-1 decodes)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--every", type=int, default=1, help="print every Nth batch size (all are measured)")
    args = parser.parse_args()

    path = default_tiny_model(tempfile.gettempdir() + "/lightning-bench-cache")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    prompts = _prompts(tokenizer, args.max_batch)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"cpu: {_cpu_name()} ({capability}), {os.cpu_count()} cores, torch {torch.__version__}")
    print(
        f"{len(prompts)} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, {args.steps} tokens each"
    )
    header = "logits | logprob p=1 | logprob p<1 | cut mass | nucleus flips | flip jump | tokens differ"
    per_threads: dict[int, torch.Tensor] = {}
    forced: list[list[int]] = []
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            rows = ", ".join(f"B={b}: {d:.1e}" for b, d in _linear_rows(model, sorted({2, 8, args.max_batch})))
            print(f"\n{threads} thread(s), output head, B rows at once vs one at a time: {rows}")
            forced = forced or _sampled_tokens(model, pad_id, prompts, args.steps)
            one = [_run_batch(model, pad_id, [p], [f])[0] for p, f in zip(prompts, forced, strict=True)]
            sequential = torch.stack(one)
            per_threads[threads] = sequential
            full = _full_forward(model, prompts, forced)
            total_seq, total_full = Diff(), Diff()
            print(f"\n| threads | B | vs sequential: {header} | vs full forward: {header} |")
            print("|---|---|" + "---|" * 14)
            for size in range(1, args.max_batch + 1):
                batched = _run_batch(model, pad_id, prompts[:size], forced[:size])
                seq, ful = Diff(), Diff()
                seq.add(batched, sequential[:size])
                ful.add(batched, full[:size])
                total_seq.merge(seq)
                total_full.merge(ful)
                if size % args.every == 0 or size == 1:
                    print(f"| {threads} | {size} | {seq.cells()} | {ful.cells()} |")
            print(f"| {threads} | all | {total_seq.cells()} | {total_full.cells()} |")
    if len(per_threads) > 1:
        first, *others = args.threads
        for other in others:
            between = Diff()
            between.add(per_threads[first], per_threads[other])
            print(f"\nsequential, {first} vs {other} threads: {header}\n{between.cells()}")


if __name__ == "__main__":
    main()
