"""How close SmolLM2-135M runs to this CPU's matmul rate: prefill, decode and one update (issue 40).

A speed figure means little without the limit it is measured against. This script measures the
machine's dense matmul rate (fp32 and bf16, at the torch thread count in use), then runs SmolLM2-135M
through the project's own code paths and prints each as tokens/s and as a fraction of the compute
bound that the model's FLOPs per token imply at the precision used:

- **prefill**: ``KVBatch.prefill`` (the engine's batch) of distinct demo-shaped prompts, so no prefix is
  shared and every prompt token is computed;
- **decode**: ``KVBatch.decode`` steps at the demo's concurrency (64 rows over a demo-length cache),
  the model step alone, then the same rows through ``TransformersEngine`` (sampling, scheduling,
  logprobs included);
- **update**: one ``TorchBackend.update`` of the SmolLM2 demo's RL settings (LoRA rank 16 on the top
  15 layers, shared prefix, 4,096-token micro-batches, no KL measured) on 64 transitions shaped like
  the demo's; at bfloat16 the frozen base in bfloat16 and the logprobs recomputed in the same pass.

FLOPs are counted from the model's config, for the work done: 2 per multiply-add of every linear
layer a token passes through (the output head only where logits are computed), plus attention's
``QK^T`` and ``AV`` over the context each token sees. An update's backward costs one forward's worth
of activation gradients through the adapted layers (the frozen base weights get none under LoRA,
and nothing below the lowest adapter needs a gradient) and through the head.

    uv run python benchmarks/roofline.py [--threads 2] [--dtype float32,bfloat16] [--markdown] [--profile]

``--profile`` answers what bounds a figure that falls short: it runs prefill, a few decode steps and
the update once more under ``torch.profiler`` and splits their time into matmul kernels (with the rate
those kernels reach on the model's own shapes), attention, the other operators, and time outside any
operator (Python and dispatch).

The compute bound is the best of several large matmuls of the model's own shapes, so a fraction near
1 means the matmuls dominate and run at full rate; the rest is time spent outside matmuls
(attention softmax, sampling, Python, memory traffic).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from _common import generated_line

__all__ = ["main", "ModelShape", "Breakdown", "profile_breakdown", "demo_prompts", "peak_rss_gb", "reset_peak_rss"]

_DEMO_ROWS = 64  # the demo's concurrency: 8 tasks x 8 samples
_RESPONSE = 24  # tokens per response (the demo's responses are 10-40)


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that set a decoder's FLOPs per token."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        return cls(
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            vocab=config.vocab_size,
        )

    def body_flops(self, context: float) -> float:
        """Forward FLOPs of one token through every layer, attending to ``context`` positions."""
        d, kv = self.hidden, self.hidden * self.kv_heads // self.heads
        linear = 2 * (d * d + 2 * d * kv + d * d + 3 * d * self.intermediate)
        attention = 2 * 2 * context * d
        return self.layers * (linear + attention)

    @property
    def head_flops(self) -> float:
        return 2.0 * self.hidden * self.vocab


def matmul_rate(dtype: torch.dtype, shape: ModelShape, windows: int = 5) -> float:
    """Best FLOP/s over large matmuls of the model's own shapes (tokens x hidden @ hidden x intermediate),
    each timed over ``windows`` windows of 20: on a shared or virtual machine one short window can land
    in a slow or a fast moment (an AMX Xeon gave 776 and 2,024 GFLOP/s in two runs of one window), and
    the best of several is the rate the machine can reach."""
    best = 0.0
    for m, k, n in ((2048, shape.hidden, shape.intermediate), (2048, shape.intermediate, shape.hidden)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        for _ in range(3):
            a @ b
        reps = 20
        for _ in range(windows):
            start = time.perf_counter()
            for _ in range(reps):
                a @ b
            best = max(best, 2 * m * k * n * reps / (time.perf_counter() - start))
    return best


def demo_prompts(tokenizer: Any, n: int, seed: int) -> list[list[int]]:
    """``n`` distinct first-turn prompts of the demo's calculator agent, rendered with the model's template."""
    from lightning_rl.demo.calculator import CALCULATOR_TOOL, SYSTEM_PROMPT, make_tasks

    out: list[list[int]] = []
    for task in make_tasks(n, seed=seed):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.input["question"]}]
        text = tokenizer.apply_chat_template(
            messages, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False
        )
        out.append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


def _load(dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_rl.engine.models import resolve_model

    path = resolve_model("smollm2-135m")
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval(), AutoTokenizer.from_pretrained(path)


def reset_peak_rss() -> None:
    """Start a new peak-RSS window (Linux: ``/proc/self/clear_refs``); a no-op elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_gb() -> float:
    """Peak resident memory since the last ``reset_peak_rss`` (``VmHWM``), in GB; NaN off Linux."""
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    except OSError:
        return float("nan")
    return int(found.group(1)) / 1e6 if found else float("nan")


@dataclass
class Row:
    what: str
    dtype: str
    tokens_per_s: float
    gflops: float
    bound_gflops: float
    note: str
    peak_gb: float

    @property
    def fraction(self) -> float:
        return self.gflops / self.bound_gflops


_MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"})
_SOFTMAX_OPS = frozenset({"aten::_softmax", "aten::softmax", "aten::_softmax_backward_data"})
"""An eager attention's softmax; the output head's ``log_softmax`` over the vocabulary is not attention."""


@dataclass
class Breakdown:
    """Where one profiled call spent its time, in milliseconds of wall time."""

    what: str
    wall_ms: float
    matmul_ms: float
    matmul_gflops: float
    """The rate inside the matmul kernels alone (the profiler's FLOP count over their self time)."""
    attention_ms: float
    other_ms: float
    top_other: list[tuple[str, float]]

    @property
    def outside_ms(self) -> float:
        """Wall time inside no operator: Python, the scheduler, dispatch between operators."""
        return max(0.0, self.wall_ms - self.matmul_ms - self.attention_ms - self.other_ms)


def profile_breakdown(what: str, call: Any) -> Breakdown:
    """Run ``call()`` once under ``torch.profiler`` and split its wall time by kind of operator.

    Self times are summed over leaf work (an operator's own time, not its children's), so the kinds add
    up to at most the wall time; what is left is time outside any operator. The profiler adds a few
    microseconds per operator, which lands mostly in that remainder: treat it as an upper bound."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        start = time.perf_counter()
        call()
        wall = time.perf_counter() - start
    matmul_us = attention_us = other_us = 0.0
    matmul_flops = 0.0
    others: dict[str, float] = {}
    for event in prof.key_averages():
        self_us = float(event.self_cpu_time_total)
        if event.key in _MATMUL_OPS:
            matmul_us += self_us
            matmul_flops += float(event.flops or 0)
        elif "attention" in event.key or event.key in _SOFTMAX_OPS:
            attention_us += self_us
        else:
            other_us += self_us
            others[event.key] = others.get(event.key, 0.0) + self_us
    top = sorted(others.items(), key=lambda kv: -kv[1])[:4]
    return Breakdown(
        what=what,
        wall_ms=wall * 1e3,
        matmul_ms=matmul_us / 1e3,
        matmul_gflops=matmul_flops / matmul_us / 1e3 if matmul_us else 0.0,
        attention_ms=attention_us / 1e3,
        other_ms=other_us / 1e3,
        top_other=[(k, v / 1e3) for k, v in top],
    )


Profiles = list[Callable[[], Breakdown]]
"""Profiled calls a measurement leaves to run once its own figures (and peak memory) are read."""


def measure_prefill(
    model: Any, prompts: list[list[int]], shape: ModelShape, profiles: Profiles | None = None
) -> tuple[float, float]:
    """(tokens/s, FLOP/s) of one ``KVBatch.prefill`` of distinct prompts (every token computed); with
    ``profiles``, a call that profiles one more prefill is appended."""
    from lightning_rl.engine._batch import KVBatch

    with torch.inference_mode():
        KVBatch(model, 0, torch.device("cpu")).prefill([p[:32] for p in prompts[:2]])  # warm-up
        times = []
        for _ in range(2):
            batch = KVBatch(model, 0, torch.device("cpu"))
            start = time.perf_counter()
            batch.prefill(prompts)
            times.append(time.perf_counter() - start)
    if profiles is not None:

        def profiled() -> Breakdown:
            with torch.inference_mode():
                return profile_breakdown("prefill", lambda: KVBatch(model, 0, torch.device("cpu")).prefill(prompts))

        profiles.append(profiled)
    tokens = sum(len(p) for p in prompts)
    flops = sum(sum(shape.body_flops(i + 1) for i in range(len(p))) + shape.head_flops for p in prompts)
    best = min(times)
    return tokens / best, flops / best


def measure_decode(
    model: Any, prompts: list[list[int]], shape: ModelShape, steps: int, profiles: Profiles | None = None
) -> tuple[float, float]:
    """(tokens/s, FLOP/s) of ``KVBatch.decode`` steps for every row at once (greedy, no sampling); with
    ``profiles``, a call that profiles one more step of the same rows is appended."""
    from lightning_rl.engine._prefix import SharedPrefixBatch

    with torch.inference_mode():
        batch = SharedPrefixBatch(model, 0, torch.device("cpu"))
        tokens: list[int] = batch.prefill(prompts).argmax(-1).tolist()
        tokens = batch.decode(tokens).argmax(-1).tolist()  # warm-up step
        start = time.perf_counter()
        for _ in range(steps):
            tokens = batch.decode(tokens).argmax(-1).tolist()
        elapsed = time.perf_counter() - start
    if profiles is not None:

        def profiled() -> Breakdown:
            with torch.inference_mode():
                return profile_breakdown("decode step", lambda: batch.decode(tokens).argmax(-1))

        profiles.append(profiled)
    rows = len(prompts)
    context = statistics.mean(len(p) for p in prompts) + 1 + steps / 2
    flops = rows * steps * (shape.body_flops(context) + shape.head_flops)
    return rows * steps / elapsed, flops / elapsed


def measure_engine(model: Any, tokenizer: Any, prompts: list[list[int]], shape: ModelShape) -> tuple[float, float]:
    """(generated tokens/s, FLOP/s) of ``TransformersEngine.generate`` for every prompt at once, sampled."""
    from lightning_rl.engine.base import SamplingParams
    from lightning_rl.engine.hf import TransformersEngine

    engine = TransformersEngine(model, tokenizer, max_batch_size=len(prompts), model_name="smollm2-135m")

    async def run() -> tuple[int, float, float]:
        params = [SamplingParams(max_tokens=_RESPONSE, temperature=1.0, seed=i) for i in range(len(prompts))]
        start = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
        elapsed = time.perf_counter() - start
        flops = 0.0
        for prompt, out in zip(prompts, outs, strict=True):
            n = len(out.token_ids)
            flops += sum(shape.body_flops(len(prompt) + i) + shape.head_flops for i in range(1, n))
        return sum(len(o.token_ids) for o in outs), elapsed, flops

    try:
        asyncio.run(run())  # warm-up
        generated, elapsed, flops = asyncio.run(run())
    finally:
        engine.close()
    return generated / elapsed, flops / elapsed


def measure_update(
    prompts: list[list[int]],
    shape: ModelShape,
    dtype: str,
    pad_id: int,
    micro_batch_tokens: int,
    profiles: Profiles | None = None,
) -> tuple[float, float, float, float]:
    """(response tokens/s, processed tokens/s, FLOP/s, seconds) of one ``TorchBackend.update`` with the
    SmolLM2 demo's RL settings (``DemoConfig.smollm2``: LoRA rank 16 on the top layers, shared prefix,
    an update that measures no KL). At bfloat16 the frozen base is stored in bfloat16 and the logprobs
    are recomputed in the update's own pass, as ``TrainerConfig.precision`` sets it up."""
    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.demo.run import DemoConfig
    from lightning_rl.types import Transition

    demo = DemoConfig.smollm2()
    rng = random.Random(0)
    transitions = [
        Transition(
            prompt_ids=p,
            response_ids=[rng.randrange(100, 40_000) for _ in range(_RESPONSE)],
            response_logprobs=[-1.0] * _RESPONSE,
            advantage=rng.choice([-1.0, 1.0]),
            rollout_id=f"r{i}",
            attempt_id=f"a{i}",
        )
        for i, p in enumerate(prompts)
    ]
    low = dtype != "float32"
    config = TorchBackendConfig(
        lr=demo.rl_lr,
        lora_rank=demo.lora_rank,
        lora_alpha=2 * demo.lora_rank,
        lora_layers=demo.lora_layers,
        track_kl=False,
        shared_prefix=demo.shared_prefix,
        micro_batch_tokens=micro_batch_tokens,
        dtype=dtype,
        old_logprobs="recompute" if low else "sampled",
    )
    backend = TorchBackend(_load(getattr(torch, dtype))[0], config, pad_token_id=pad_id)
    backend.update(transitions[:8])  # warm-up
    start = time.perf_counter()
    backend.update(transitions)
    elapsed = time.perf_counter() - start
    if profiles is not None:  # the adapters have moved; the work per update has not
        profiles.append(lambda: profile_breakdown("update", lambda: backend.update(transitions)))
    # what ran: per micro-batch the shared prefix once, then each row's rest, forward through every
    # layer; the backward computes activation gradients (one forward's worth) from the top down to
    # the lowest adapted layer only (the frozen weights get none), and through the head
    adapted = (demo.lora_layers or shape.layers) / shape.layers
    processed = 0
    flops = 0.0
    for mb in backend._pack([(t.prompt_ids, t.response_ids) for t in transitions]):  # pyright: ignore[reportPrivateUsage]
        shared = backend.shared_prefix_len(mb)
        width = mb.input_ids.shape[1]
        rows = mb.input_ids.shape[0]
        seen = shared + rows * (width - shared)
        processed += seen
        body = sum(shape.body_flops(i + 1) for i in range(shared)) + rows * sum(
            shape.body_flops(i + 1) for i in range(shared, width)
        )
        head = sum(mb.response_lens) * shape.head_flops
        flops += (1 + adapted) * body + 2 * head
    responses = sum(len(t.response_ids) for t in transitions)
    return responses / elapsed, processed / elapsed, flops / elapsed, elapsed


def run_profiles(
    found: Profiles | None, profiles: list[tuple[str, float, Breakdown]], dtype: str, bound: float
) -> None:
    """Run what the last measurement left to profile, once its peak memory was read (the profiler's
    own records would count in it), and start a new peak window for the next measurement."""
    if not found:
        return
    profiles.extend((dtype, bound, call()) for call in found)
    found.clear()
    reset_peak_rss()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--dtype", default="float32,bfloat16", help="precisions to measure, comma-separated")
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096, help="the update's micro-batch budget")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: prefill,decode,engine,update")
    parser.add_argument("--markdown", action="store_true", help="print a markdown block for benchmarks/README.md")
    parser.add_argument(
        "--profile", action="store_true", help="also split prefill, decode and update time by operator kind"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    load_start = os.getloadavg()[0]  # other jobs on the machine slow every figure: say how busy it was
    rows: list[Row] = []
    profiles: list[tuple[str, float, Breakdown]] = []  # (dtype, bound, breakdown)
    from lightning_rl.backends.torch_backend import cpu_flags, fast_bfloat16

    flags = cpu_flags()
    native = flags is None or bool(flags & {"avx512_bf16", "amx_bf16"})
    if "bfloat16" in args.dtype and native:  # measured either way; this says what precision=auto picks
        print(f"[precision auto] {'bfloat16' if fast_bfloat16('cpu') else 'float32'} (fast_bfloat16)")
    for name in args.dtype.split(","):
        dtype = getattr(torch, name)
        if dtype == torch.bfloat16 and not native:
            # emulated: one large bfloat16 matmul takes seconds; say so and measure nothing with it
            a, b = torch.randn(64, 256, dtype=dtype), torch.randn(256, 256, dtype=dtype)
            start = time.perf_counter()
            a @ b
            rate = 2 * 64 * 256 * 256 / (time.perf_counter() - start) / 1e9
            print(f"[bfloat16] this CPU has no AVX512_BF16 or AMX: bfloat16 is emulated ({rate:.1f} GFLOP/s); skipped")
            continue
        model, tokenizer = _load(dtype)
        shape = ModelShape.of(model.config)
        bound = matmul_rate(dtype, shape)
        print(f"[{name}] matmul bound {bound / 1e9:.1f} GFLOP/s at {torch.get_num_threads()} threads", flush=True)
        prompts = demo_prompts(tokenizer, _DEMO_ROWS, seed=0)
        pad = int(tokenizer.pad_token_id or 0)

        def add(what: str, tps: float, flops: float, note: str) -> None:
            peak = peak_rss_gb()
            rows.append(Row(what, name, tps, flops / 1e9, bound / 1e9, note, peak))  # noqa: B023
            print(
                f"  {what}: {tps:.0f} tokens/s, {flops / 1e9:.1f} GFLOP/s = {flops / bound:.0%} of bound "  # noqa: B023
                + ("" if args.profile else f"(peak RSS {peak:.2f} GB)"),
                flush=True,
            )
            reset_peak_rss()

        reset_peak_rss()
        found: Profiles | None = [] if args.profile else None

        if "prefill" not in skip:
            tps, flops = measure_prefill(model, prompts[:16], shape, found)
            add("prefill", tps, flops, f"16 distinct prompts of {len(prompts[0])} tokens")
            run_profiles(found, profiles, name, bound)
        if "decode" not in skip:
            tps, flops = measure_decode(model, prompts, shape, args.decode_steps, found)
            add("decode step", tps, flops, f"{len(prompts)} rows, greedy, model step only")
            run_profiles(found, profiles, name, bound)
        if "engine" not in skip:
            tps, flops = measure_engine(model, tokenizer, prompts, shape)
            add("engine generate", tps, flops, f"{len(prompts)} requests, sampled, {_RESPONSE} tokens max")
        if "update" not in skip:
            del model  # the update loads its own copy
            model = None
            rtps, ptps, flops, seconds = measure_update(prompts, shape, name, pad, args.micro_batch_tokens, found)
            add("update", ptps, flops, f"{len(prompts)} transitions, {rtps:.0f} response tokens/s, {seconds:.1f} s")
            run_profiles(found, profiles, name, bound)
        del model
    machine = (
        f"Python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    print()
    print(generated_line("roofline.py", argv, machine))
    print()

    def peak(r: Row) -> str:
        # the profiler's records stay resident once the first part is profiled: no honest peak after it
        return "-" if args.profile else f"{r.peak_gb:.2f} GB"

    if args.profile:
        print("(peak RSS not measured with --profile: the profiler's records stay resident)\n")
    print("| what | dtype | tokens/s | GFLOP/s | bound GFLOP/s | of bound | peak RSS | what ran |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r.what} | {r.dtype} | {r.tokens_per_s:.0f} | {r.gflops:.1f} | {r.bound_gflops:.1f} | "
            f"**{r.fraction:.0%}** | {peak(r)} | {r.note} |"
        )
    if profiles:
        print_profiles(profiles)


def print_profiles(profiles: list[tuple[str, float, Breakdown]]) -> None:
    """The ``--profile`` table: one profiled call per row, its wall time split by kind of operator."""
    print()
    print(
        "One call of each under torch.profiler (self times; 'outside' is wall time inside no operator: "
        "Python, scheduling, dispatch, plus the profiler's own cost):"
    )
    print()
    print(
        "| what | dtype | wall | matmul kernels | their rate | of bound | attention | other operators | outside "
        "| largest other operators |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for dtype, bound, b in profiles:
        wall = b.wall_ms

        def share(ms: float) -> str:
            return f"{ms:.0f} ms ({ms / wall:.0%})"  # noqa: B023

        top = ", ".join(f"{k.removeprefix('aten::')} {v:.0f} ms" for k, v in b.top_other)
        print(
            f"| {b.what} | {dtype} | {b.wall_ms:.0f} ms | {share(b.matmul_ms)} | {b.matmul_gflops:.0f} GFLOP/s | "
            f"{b.matmul_gflops * 1e9 / bound:.0%} | {share(b.attention_ms)} | {share(b.other_ms)} | "
            f"{share(b.outside_ms)} | {top} |"
        )


if __name__ == "__main__":
    main()
