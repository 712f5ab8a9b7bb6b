"""What each way of serving a multi-agent app's roles keeps in memory (issue 42).

Three arms, each in a fresh process, built as ``lightning_rl.trainer.services.start_services`` builds
them and put through one real update of two trainable roles and one publish:

- ``shared``: the engine plus the trained policy (``TorchBackend``, all weights, AdamW state);
- ``frozen``: the same plus a second engine on the starting weights (``FrozenRolesBackend``);
- ``per_role``: one engine serving a LoRA adapter per role over the base, and the trainer's
  ``PerRoleAdaptersBackend`` over the same base tensors (``share_base_weights``).

For each it reports the bytes of every distinct tensor the arm holds after the update (parameters,
buffers, gradients, optimiser state, adapters; a tensor two models share is counted once) and the
process's peak resident memory over the build, update and publish, minus its resident memory after
the imports. The tiny model of the examples (1.2M parameters) is small next to torch's own heap, so
``--hidden``/``--layers`` build a larger tiny-kit model too, where the weights dominate::

    uv run python benchmarks/adapter_memory.py                          # the examples' tiny model
    uv run python benchmarks/adapter_memory.py --hidden 768 --layers 12 # ~100M parameters
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from typing import Any

from _common import generated_line

__all__ = ["ARMS", "measure", "main"]

ARMS = ("shared", "frozen", "per_role")


def _tensor_bytes(objects: list[Any]) -> int:
    """Bytes of the distinct storages of every tensor reachable from modules and optimisers in ``objects``."""
    import torch

    seen: dict[int, int] = {}

    def add(t: Any) -> None:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()

    def walk(state: Any) -> None:
        if isinstance(state, dict):
            for v in state.values():  # pyright: ignore[reportUnknownVariableType]
                walk(v)
        elif isinstance(state, list | tuple):
            for v in state:  # pyright: ignore[reportUnknownVariableType]
                walk(v)
        else:
            add(state)

    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            for t in obj.state_dict(keep_vars=True).values():
                add(t)
                if t.grad is not None:
                    add(t.grad)
            for module in obj.modules():  # per-row adapters: plain tensors on the engine's layers
                for name in ("lora_a", "lora_b"):
                    add(getattr(module, name, None))
        elif isinstance(obj, torch.optim.Optimizer):
            walk(obj.state_dict()["state"])
    return sum(seen.values())


def _rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1e6
    return float("nan")


def measure(arm: str, model: str) -> dict[str, Any]:
    """Build ``arm`` over ``model``, run one update of two roles and a publish; what it holds."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM

    from lightning_rl.backends.publish import engine_publisher
    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.memory import PeakMemory
    from lightning_rl.trainer.config import TrainerConfig
    from lightning_rl.trainer.services import _per_role_adapters  # pyright: ignore[reportPrivateUsage]
    from lightning_rl.types import Transition

    torch.manual_seed(0)
    start_rss = _rss_gb()
    peak = PeakMemory()
    engine = TransformersEngine.from_pretrained(model, max_batch_size=8)
    policy = AutoModelForCausalLM.from_pretrained(model)
    extra: list[Any] = []
    backend: Any
    if arm == "per_role":
        config = TrainerConfig(model=model, adapters="per_role", backend=TorchBackendConfig(lora_rank=8, lr=1e-3))
        backend, _ = _per_role_adapters(config, engine, policy)
    else:
        backend = TorchBackend(policy, TorchBackendConfig(lr=1e-5), publisher=engine_publisher(engine))
        if arm == "frozen":
            extra.append(TransformersEngine.from_pretrained(model, max_batch_size=8))
    prompt = engine.encode_chat([{"role": "user", "content": "what is the salary of ruzi?"}], None)
    batch = [
        Transition(
            prompt_ids=prompt,
            response_ids=[5 + i, 6, 7, 8],
            role=role,
            rollout_id=f"{role}-{i}",
            attempt_id="a",
            advantage=1.0 if i % 2 else -1.0,
            response_logprobs=[-1.0] * 4,
        )
        for role in ("writer", "rewriter")
        for i in range(8)
    ]
    backend.update(batch)
    asyncio.run(backend.publish())
    peak.phase("arm")
    optimizers = [getattr(backend, "optimizer", None), *getattr(backend, "_optimizers", {}).values()]
    held = [engine.model, backend.model, *(e.model for e in extra), *(o for o in optimizers if o is not None)]
    for copy in (getattr(backend, "reference", None), getattr(backend, "_start", None)):
        if copy is not None:
            held.append(copy)
    result = {
        "arm": arm,
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "tensor_bytes": _tensor_bytes(held),
        "peak_rss_gb": peak.peaks.get("arm"),
        "start_rss_gb": start_rss,
    }
    engine.close()
    for e in extra:
        e.close()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=None, help="a larger tiny-kit model: hidden size")
    ap.add_argument("--layers", type=int, default=None, help="... and layers (default: the examples' tiny model)")
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm, in the child process
    args = ap.parse_args(argv)
    from lightning_rl.engine.tiny import default_tiny_model

    overrides: dict[str, int] = {}
    if args.hidden is not None:
        overrides |= {"hidden": args.hidden, "intermediate": 4 * args.hidden, "heads": max(4, args.hidden // 64)}
        overrides["kv_heads"] = overrides["heads"] // 2
    if args.layers is not None:
        overrides["layers"] = args.layers
    model = str(default_tiny_model(**overrides))
    if args.arm:
        print(json.dumps(measure(args.arm, model)))
        return 0
    rows: list[dict[str, Any]] = []
    for arm in ARMS:
        child = [sys.executable, __file__, "--arm", arm, *(argv if argv is not None else sys.argv[1:])]
        out = subprocess.run(child, capture_output=True, text=True, check=True, env={**os.environ})
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(generated_line("adapter_memory.py", argv, f"Python {platform.python_version()}, one process per arm"))
    print()
    print(f"Model: {rows[0]['parameters'] / 1e6:.1f}M parameters (float32), two trainable roles, one update.")
    print()
    print("| arm | tensors held | vs frozen | peak RSS growth |")
    print("|---|---:|---:|---:|")
    frozen = next(r["tensor_bytes"] for r in rows if r["arm"] == "frozen")
    for r in rows:
        growth = r["peak_rss_gb"] - r["start_rss_gb"] if r["peak_rss_gb"] is not None else None
        print(
            f"| {r['arm']} | {r['tensor_bytes'] / 1e6:.1f} MB | {r['tensor_bytes'] / frozen:.2f}x | "
            + (f"{growth * 1e3:.0f} MB |" if growth is not None else "— |")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
