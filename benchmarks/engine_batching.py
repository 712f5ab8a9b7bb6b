"""Embedded engine throughput: concurrent requests batched together versus served one at a time.

Dynamic batching is what makes the embedded engine usable for RL on one machine: a GRPO group sends
many completions at once, and one batched forward pass costs little more than a single one. This
measures generated tokens per second for ``--requests`` concurrent requests (batched by the engine's
scheduler) against the same requests awaited one after another, median of ``--runs`` runs, and prints
a markdown table row. Target: batched >= 3x sequential for 16 requests on the tiny model.

    uv run python benchmarks/engine_batching.py [--model PATH] [--device cpu|cuda] [--requests 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import torch

from lightning_rl.engine import SamplingParams
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.tiny import default_tiny_model

__all__ = ["main"]

_TOPICS = "weather numbers cities tools rewards agents models tasks words files code lists letters days".split()


def _prompts(engine: TransformersEngine, count: int) -> list[list[int]]:
    return [
        engine.encode_chat([{"role": "user", "content": f"Tell me about {_TOPICS[i % len(_TOPICS)]}, please."}], None)
        for i in range(count)
    ]


async def _timed(run: Callable[[], Awaitable[int]]) -> float:
    """Tokens per second of one run."""
    start = time.perf_counter()
    tokens = await run()
    return tokens / (time.perf_counter() - start)


async def _measure(engine: TransformersEngine, requests: int, max_tokens: int, runs: int) -> tuple[float, float]:
    prompts = _prompts(engine, requests)

    def params(i: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i)

    async def batched() -> int:
        outs = await asyncio.gather(*(engine.generate(p, params(i)) for i, p in enumerate(prompts)))
        return sum(len(o.token_ids) for o in outs)

    async def sequential() -> int:
        return sum([len((await engine.generate(p, params(i))).token_ids) for i, p in enumerate(prompts)])

    await batched()  # warm-up: first-call allocations and kernel selection
    seq = [await _timed(sequential) for _ in range(runs)]
    bat = [await _timed(batched) for _ in range(runs)]
    return statistics.median(seq), statistics.median(bat)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", help="an HF folder; default: the tiny model (built once and cached)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, help="torch intra-op threads (1 is steadier on a busy, shared CPU); default torch's"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = args.model or str(default_tiny_model(tempfile.gettempdir() + "/lightning-bench-cache"))
    with TransformersEngine.from_pretrained(model, device=args.device, max_batch_size=args.requests) as engine:
        seq, bat = asyncio.run(_measure(engine, args.requests, args.max_tokens, args.runs))
    name = "tiny" if args.model is None else engine.model_name
    threads = torch.get_num_threads()
    print("| model | device | threads | requests | max tokens | one at a time (tok/s) | batched (tok/s) | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {name} | {args.device} | {threads} | {args.requests} | {args.max_tokens} "
        f"| {seq:.0f} | {bat:.0f} | {bat / seq:.1f}x |"
    )


if __name__ == "__main__":
    main()
