"""The engine's memory during a demo-sized generation: peak resident memory above the loaded model.

Issue 40's 3 GB target for the SmolLM2 demo is set by its rollouts as much as by its updates: 64
requests at once, each with a ~310-token prompt (system prompt, tool schema, question), so the KV
cache alone is 64 x ~360 tokens x 30 layers x 2 x 3 heads x 64 dims = ~1 GB in float32. This script
generates for ``--prompts`` distinct demo prompts at once through ``TransformersEngine`` (shared
prefix, continuous batching: the engine's own path) and prints, per ``--rows`` (the engine's
``max_batch_size``), the generated tokens/s and the process's peak RSS above what it held before
(``/proc/self/clear_refs``, reset after a warm-up run and ``malloc_trim``).

    uv run python benchmarks/engine_memory.py [--model smollm2-135m] [--rows 64,32] [--dtype float32]

To compare two trees (before/after a change) run it with ``PYTHONPATH=<tree>/packages/core/src``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from typing import Any

import torch
from _common import generated_line, rss_gb
from roofline import demo_prompts, peak_rss_gb, reset_peak_rss

__all__ = ["main", "measure"]


def measure(
    model: Any, tokenizer: Any, prompts: list[list[int]], rows: int, max_tokens: int
) -> tuple[int, float, float, float]:
    """(generated tokens, seconds, RSS before in GB, peak RSS in GB) of one generation of every prompt
    at once through an engine of ``rows`` rows; a first, unmeasured run warms the engine up."""
    from lightning_rl.engine.base import SamplingParams
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.memory import release_free_memory

    engine = TransformersEngine(model, tokenizer, max_batch_size=rows, model_name="engine-memory")

    async def run() -> tuple[int, float]:
        params = [SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i) for i in range(len(prompts))]
        start = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
        return sum(len(o.token_ids) for o in outs), time.perf_counter() - start

    try:
        asyncio.run(run())
        release_free_memory()
        before = rss_gb()
        reset_peak_rss()
        generated, seconds = asyncio.run(run())
        return generated, seconds, before, peak_rss_gb()
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="a name resolve_model knows, or an HF folder")
    parser.add_argument("--prompts", type=int, default=64, help="distinct demo prompts generated at once")
    parser.add_argument("--rows", default="64,32", help="engine max_batch_size values, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=48, help="the demo's max_tokens per call")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_rl.engine.models import resolve_model

    path = resolve_model(args.model) if not os.path.isdir(args.model) else args.model
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = demo_prompts(tokenizer, args.prompts, seed=5)
    machine = f"Python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    print(generated_line("engine_memory.py", argv, machine))
    lengths = sorted(len(p) for p in prompts)
    print(
        f"\n{len(prompts)} prompts of {lengths[0]}-{lengths[-1]} tokens, {args.dtype}, max_tokens {args.max_tokens}\n"
    )
    print("| rows | generated tokens | seconds | tokens/s | RSS before | peak RSS | above before |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rows in (int(r) for r in args.rows.split(",")):
        generated, seconds, before, peak = measure(model, tokenizer, prompts, rows, args.max_tokens)
        print(
            f"| {rows} | {generated} | {seconds:.1f} | {generated / seconds:.0f} | {before:.2f} GB | "
            f"{peak:.2f} GB | **+{peak - before:.2f} GB** |",
            flush=True,
        )


if __name__ == "__main__":
    main()
