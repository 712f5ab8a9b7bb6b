"""CPU time of one batched decode step of the embedded engine's KV batch, by batch size.

``rollout_throughput.py`` measures the whole RL phase, whose wall-clock time on a shared host
depends on what else runs; this isolates the engine's decode step (``engine._prefix.SharedPrefixBatch``,
the batch the engine runs) and reports **thread CPU time**, which other jobs on the machine disturb
little. Traffic shaped like the demo's: rows share a 55-token system prompt, 8 rows per distinct
prompt (a GRPO group), greedy decoding for ``--steps`` steps with 2 rows leaving every 10 steps (as
rows finish). Per batch size: the prefill's CPU ms and the CPU ms per decode step (median of
``--runs``, after a warm-up). ``--profile`` adds torch's operator table for the largest batch.

    uv run python benchmarks/engine_decode_step.py --model runs/demo/warm_start [--rows 8 32 128] [--profile]

Without ``--model`` the tiny model (random weights) is used; the numbers depend on the model's
shape, not its weights.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from lightning_rl.engine._prefix import SharedPrefixBatch
from lightning_rl.engine.tiny import default_tiny_model

__all__ = ["main"]


def _prompts(rows: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    system = torch.randint(10, vocab, (55,), generator=generator).tolist()
    distinct = [system + torch.randint(10, vocab, (9 + i % 5,), generator=generator).tolist() for i in range(16)]
    return [distinct[(i // 8) % len(distinct)] for i in range(rows)]


def _run(model: Any, prompts: list[list[int]], steps: int, profiler: Any = None) -> tuple[float, float]:
    """(prefill CPU s, decode CPU s per step) of one batch."""
    batch = SharedPrefixBatch(model, 0, torch.device("cpu"))
    with torch.inference_mode():
        start = time.thread_time()
        tokens: list[int] = batch.prefill(prompts).argmax(-1).tolist()
        prefill = time.thread_time() - start
        if profiler is not None:
            profiler.start()
        start = time.thread_time()
        for step in range(steps):
            tokens = batch.decode(tokens).argmax(-1).tolist()
            if step % 10 == 9 and batch.size > 2:
                batch.keep(list(range(2, batch.size)))
                tokens = tokens[2:]
        decode = (time.thread_time() - start) / steps
        if profiler is not None:
            profiler.stop()
    return prefill, decode


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="an HF folder; default: the tiny model")
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--profile", action="store_true", help="torch profiler table for the largest batch")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or str(default_tiny_model(tempfile.gettempdir() + "/lightning-bench-cache"))
    model: Any = AutoModelForCausalLM.from_pretrained(path).eval()
    vocab = int(model.config.vocab_size)

    print(f"model: {path}; torch threads {torch.get_num_threads()}; {args.steps} decode steps, median of {args.runs}")
    print("| rows | prefill CPU ms | decode step CPU ms (median) | runs |")
    print("|---:|---:|---:|---|")
    for rows in args.rows:
        prompts = _prompts(rows, vocab)
        _run(model, prompts, args.steps)  # warm-up
        results = [_run(model, prompts, args.steps) for _ in range(args.runs)]
        prefill = statistics.median(r[0] for r in results) * 1e3
        decode = [r[1] * 1e3 for r in results]
        runs = ", ".join(f"{d:.2f}" for d in decode)
        print(f"| {rows} | {prefill:.1f} | **{statistics.median(decode):.2f}** | {runs} |")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU])
        _run(model, _prompts(max(args.rows), vocab), args.steps, profiler)
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
