"""What each lever does to one SmolLM2 demo update: seconds and peak memory (issue 40).

One ``TorchBackend.update`` of 120 demo-shaped transitions (the first and second turns of 60
calculator questions, 19 response tokens each), with the SmolLM2 demo's settings (bfloat16 base,
LoRA rank 16, shared prefix, recomputed old logprobs), once per variant, each in a fresh process
so that its peak resident memory (``ru_maxrss``) is its own. Every variant changes one thing from the
baseline row (every layer adapted, KL measured, 4,096-token micro-batches), or from the kept levers
(``compile_layers``: each decoder layer through ``torch.compile`` with dynamic shapes, an operator
fusion the library does not do; its compile time falls in the warm-up update, which the table shows),
or from the demo's settings (the last three: what measuring ``train/kl_to_start`` costs, on the whole
batch and on ``kl_rows = 16`` of its 120 rows):

    uv run python benchmarks/update_levers.py [--threads 2] [--variants 5,7]   # indices into VARIANTS

The whole demo's figures, with the levers kept, come from ``benchmarks/learning.py`` (docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from typing import Any

from _common import generated_line

VARIANTS: dict[str, dict[str, Any]] = {
    "all layers, KL measured (before)": {},
    "no KL measured": {"track_kl": False},
    "micro-batches of 2,048 tokens": {"track_kl": False, "micro_batch_tokens": 2048},
    "micro-batches of 1,024 tokens": {"track_kl": False, "micro_batch_tokens": 1024},
    "top 20 layers adapted": {"track_kl": False, "lora_layers": 20},
    "top 15 layers adapted (kept)": {"track_kl": False, "lora_layers": 15},
    "top 10 layers adapted": {"track_kl": False, "lora_layers": 10},
    "top 15, each layer compiled": {"track_kl": False, "lora_layers": 15, "compile_layers": True},
    # the demo's settings (top 15, 2,048-token micro-batches) without, with a whole and with a sampled KL pass
    "demo settings, no KL measured": {"track_kl": False, "lora_layers": 15, "micro_batch_tokens": 2048},
    "demo settings, KL measured on every row": {"lora_layers": 15, "micro_batch_tokens": 2048},
    "demo settings, KL measured on 16 rows (kept)": {"lora_layers": 15, "micro_batch_tokens": 2048, "kl_rows": 16},
}


def one(settings: dict[str, Any], threads: int) -> dict[str, float]:
    """Runs in a child process: load SmolLM2, warm up, time two updates."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.demo.calculator import CALCULATOR_TOOL, SYSTEM_PROMPT, make_tasks
    from lightning_rl.engine.models import resolve_model
    from lightning_rl.types import Transition

    torch.set_num_threads(threads)
    path = resolve_model("smollm2-135m")
    tok: Any = AutoTokenizer.from_pretrained(path)
    first = []
    for task in make_tasks(60, seed=0):
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.input["question"]}]
        text = tok.apply_chat_template(messages, tools=[CALCULATOR_TOOL], add_generation_prompt=True, tokenize=False)
        first.append(list(tok.encode(text, add_special_tokens=False)))
    turn = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>\n'
    turn += "<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    second = [p + list(tok.encode(turn, add_special_tokens=False)) for p in first]
    rng = random.Random(0)
    transitions = [
        Transition(
            prompt_ids=p,
            response_ids=[rng.randrange(100, 40_000) for _ in range(19)],
            advantage=rng.choice([-1.0, 1.0]),
            rollout_id=f"r{i % 60}",
            attempt_id=f"a{i}",
        )
        for i, p in enumerate(first + second)
    ]
    compile_layers = bool(settings.pop("compile_layers", False))
    config: dict[str, Any] = {
        "lr": 5e-4,
        "lora_rank": 16,
        "lora_alpha": 32,
        "shared_prefix": 64,
        "micro_batch_tokens": 4096,
        "dtype": "bfloat16",
        "old_logprobs": "recompute",
        **settings,
    }
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    backend = TorchBackend(model, TorchBackendConfig(**config), pad_token_id=int(tok.pad_token_id or 0))
    if compile_layers:
        for layer in backend.model.get_base_model().model.layers:  # pyright: ignore[reportAttributeAccessIssue]
            layer.compile(dynamic=True)
    start = time.perf_counter()
    backend.update(transitions[:8])  # warm-up (and, compiled, the compilation)
    warmup_s = time.perf_counter() - start
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        backend.update(transitions)
        seconds.append(time.perf_counter() - start)
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return {"seconds": min(seconds), "warmup_s": warmup_s, "peak_gb": peak_gb}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default="", help="comma-separated indices of VARIANTS (default: all)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(one(json.loads(args.child), args.threads)))
        return
    names = list(VARIANTS)
    chosen = [names[int(i)] for i in args.variants.split(",")] if args.variants else names
    load = os.getloadavg()[0]
    rows = []
    for name in chosen:
        out = subprocess.run(
            [sys.executable, __file__, "--threads", str(args.threads), "--child", json.dumps(VARIANTS[name])],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append((name, result))
        print(
            f"{name}: {result['seconds']:.1f} s (warm-up {result['warmup_s']:.1f} s), peak {result['peak_gb']:.2f} GB",
            flush=True,
        )
    print()
    print(generated_line("update_levers.py", argv, f"{args.threads} threads; load {load:.1f} at the start"))
    print()
    print("| variant | update (120 transitions) | warm-up update (8) | peak RSS of the process |")
    print("|---|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['seconds']:.1f} s | {r['warmup_s']:.1f} s | {r['peak_gb']:.2f} GB |")


if __name__ == "__main__":
    main()
