"""Memory that torch's CPU kernels keep per input shape, by the capacity of their caches.

In bfloat16 torch runs a CPU matmul through oneDNN, and two caches keep state for each distinct
shape, up to 1,024 shapes each by default: oneDNN's primitive cache (a primitive with JIT-compiled
code; ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and ideep's cache of matmul setups in front of it
(``LRU_CACHE_CAPACITY``). A training run's shapes keep changing (each prefill and micro-batch has
its own rows x tokens), so a bfloat16 run's memory in use crept up step after step where a float32
run's did not (docs/models.md). This script feeds one SmolLM2-sized ``Linear(576, 1536)`` ``--calls``
inputs of random row counts (1 to ``--max-rows``, the same sequence for every variant) in a fresh
process per variant, with both variables at the variant's capacity (oneDNN reads its own when torch
loads), and prints each process's resident memory before and after (after ``malloc_trim``, so that
free memory glibc keeps is not counted), and the time the calls took.

    uv run python benchmarks/kernel_cache.py [--capacities default,64,8] [--dtype bfloat16,float32]

``lightning-rl`` sets both to ``lightning_rl.memory.KERNEL_CACHE_PRIMITIVES`` unless the
environment already does (``bound_kernel_cache``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

from _common import generated_line, rss_gb

from lightning_rl.memory import KERNEL_CACHE_VARIABLES

__all__ = ["main", "measure"]


def _child(dtype: str, calls: int, max_rows: int, threads: int) -> None:
    """Run the calls in this process and print ``{"before", "after", "seconds"}`` as JSON."""
    import random
    import time

    import torch

    from lightning_rl.memory import release_free_memory

    torch.set_num_threads(threads)
    layer = torch.nn.Linear(576, 1536, bias=False).to(getattr(torch, dtype))
    rows = random.Random(0)
    with torch.inference_mode():
        layer(torch.randn(1, 576, dtype=layer.weight.dtype))  # the library's own first-use state
        release_free_memory()
        before = rss_gb()
        start = time.perf_counter()
        for _ in range(calls):
            layer(torch.randn(rows.randint(1, max_rows), 576, dtype=layer.weight.dtype))
        seconds = time.perf_counter() - start
    release_free_memory()  # what glibc holds free is not the kernels' state: count memory in use only
    print(json.dumps({"before": before, "after": rss_gb(), "seconds": seconds}))


def measure(capacity: str, dtype: str, calls: int, max_rows: int, threads: int) -> dict[str, float]:
    """One variant in a fresh process: ``capacity`` is a number for both caches, or ``default`` (the
    variables unset)."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHE_VARIABLES}
    if capacity != "default":
        env.update(dict.fromkeys(KERNEL_CACHE_VARIABLES, capacity))
    argv = [sys.executable, __file__, "--child", dtype, str(calls), str(max_rows), str(threads)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--capacities", default="default,64,8", help="shapes per cache, comma-separated; 'default' leaves both unset"
    )
    parser.add_argument("--dtype", default="bfloat16,float32", help="comma-separated torch dtypes")
    parser.add_argument("--calls", type=int, default=600, help="inputs fed to the layer")
    parser.add_argument("--max-rows", type=int, default=8000, help="an input's rows are drawn from 1 to this")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args(argv)
    machine = f"Python {platform.python_version()}, {args.threads} threads"
    print(generated_line("kernel_cache.py", argv, machine))
    print(f"\n`Linear(576, 1536)` fed {args.calls} inputs of 1-{args.max_rows} random rows, a fresh process each\n")
    print("| dtype | shapes per cache | RSS before | RSS after | grown | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for dtype in args.dtype.split(","):
        for capacity in args.capacities.split(","):
            r = measure(capacity, dtype, args.calls, args.max_rows, args.threads)
            label = "1,024 (default)" if capacity == "default" else capacity
            print(
                f"| {dtype} | {label} | {r['before']:.2f} GB | {r['after']:.2f} GB | "
                f"**{r['after'] - r['before']:+.2f} GB** | {r['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
