"""How much of a CPU process's resident memory is GPU libraries it never runs, and what dropping them gives.

PyPI's torch for Linux is the CUDA build, and transformers loads triton: on a machine without a GPU
their pages stay resident after loading (``lightning_rl.memory.drop_idle_gpu_libraries``). This
loads SmolLM2-135M-Instruct (the demo's model) through the torch backend, as the demo does, and
prints the resident set, the part that is GPU libraries, after the import, after the backend's drop
and after a forward and backward pass of the model on the CPU (what the work maps back).

    uv run python benchmarks/gpu_libraries.py [--threads 2] [--tokens 256]
"""

from __future__ import annotations

import argparse
import re
import sys

from _common import generated_line, rss_gb

__all__ = ["main"]


def gpu_library_gb(pattern: re.Pattern[str]) -> float:
    """Resident GB of this process's mappings of GPU libraries (``/proc/self/smaps``)."""
    total, gpu = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                gpu = pattern.search(line) is not None
            elif gpu and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per row of the 4-row forward and backward pass")
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.engine.models import resolve_model
    from lightning_rl.memory import _GPU_LIBRARY  # pyright: ignore[reportPrivateUsage]

    torch.set_num_threads(args.threads)
    print(generated_line("gpu_libraries.py", argv, f"{args.threads} threads, torch {torch.__version__}"))
    if torch.cuda.is_available():
        sys.exit("a GPU is present: its libraries are in use, nothing to drop")
    rows: list[tuple[str, float, float]] = []
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32)
    rows.append(("model loaded", rss_gb(), gpu_library_gb(_GPU_LIBRARY)))
    backend = TorchBackend(model, TorchBackendConfig(device="cpu", dtype="float32"))  # drops them
    rows.append(("torch backend made (dropped)", rss_gb(), gpu_library_gb(_GPU_LIBRARY)))
    ids = torch.randint(0, 1000, (4, args.tokens))
    backend.model(ids).logits.float().logsumexp(-1).mean().backward()
    rows.append(("after a forward and backward pass", rss_gb(), gpu_library_gb(_GPU_LIBRARY)))
    print("\n| when | resident (GB) | of it GPU libraries (GB) |\n|---|---:|---:|")
    for when, rss, gpu in rows:
        print(f"| {when} | {rss:.2f} | {gpu:.2f} |")


if __name__ == "__main__":
    main()
