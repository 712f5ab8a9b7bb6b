"""Time of one ``TorchBackend.update`` on a fixed batch versus the raw torch floor on the same tensors.

The floor is what any trainer must spend: one forward over the same padded micro-batches, the
PPO-clip loss on the response tokens, one backward and one AdamW step — with every tensor prepared
in advance. The ratio is our overhead (packing, weights, logprob gathering, metrics).

    uv run python benchmarks/trainer_step.py            # median of 5 runs, prints a markdown row
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from lightning_rl.backends.losses import ppo_clip_loss
from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig, pack_micro_batches
from lightning_rl.engine.logprobs import sampled_logprobs
from lightning_rl.engine.tiny import default_tiny_model
from lightning_rl.types import Transition


def make_batch(n: int, prompt: int, response: int, vocab: int, seed: int = 0) -> list[Transition]:
    gen = torch.Generator().manual_seed(seed)
    out: list[Transition] = []
    for i in range(n):
        p = torch.randint(5, vocab, (prompt + i % 7,), generator=gen).tolist()
        r = torch.randint(5, vocab, (response + i % 5,), generator=gen).tolist()
        lp = (-torch.rand(len(r), generator=gen) * 3).tolist()
        out.append(
            Transition(
                prompt_ids=p,
                response_ids=r,
                response_logprobs=lp,
                rollout_id=f"r{i // 4}",
                attempt_id="a",
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return out


def floor_step(model: torch.nn.Module, opt: torch.optim.Optimizer, prepared: list[dict[str, torch.Tensor]]) -> None:
    opt.zero_grad(set_to_none=True)
    for mb in prepared:
        hidden = model.model(input_ids=mb["ids"], attention_mask=mb["mask"]).last_hidden_state  # type: ignore[operator]
        logits = model.lm_head(hidden[mb["rows"], mb["cols"]])  # type: ignore[operator]
        logp = sampled_logprobs(logits, mb["targets"], 1.0)
        ppo_clip_loss(logp, mb["old"], mb["adv"], mb["w"]).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def prepare(batch: list[Transition], budget: int) -> list[dict[str, torch.Tensor]]:
    total = sum(len(t.response_ids) for t in batch)
    out: list[dict[str, torch.Tensor]] = []
    for mb in pack_micro_batches([(t.prompt_ids, t.response_ids) for t in batch], budget, 0):
        rows = [row for row, r in enumerate(mb.response_lens) for _ in range(r)]
        cols = [p - 1 + k for p, r in zip(mb.prompt_lens, mb.response_lens, strict=True) for k in range(r)]
        ts = [batch[i] for i in mb.indices]
        out.append(
            {
                "ids": mb.input_ids,
                "mask": mb.attention_mask,
                "rows": torch.tensor(rows),
                "cols": torch.tensor(cols),
                "targets": mb.input_ids[torch.tensor(rows), torch.tensor(cols) + 1],
                "old": torch.tensor([x for t in ts for x in (t.response_logprobs or [])]),
                "adv": torch.tensor([t.advantage for t in ts for _ in t.response_ids]),
                "w": torch.full((len(rows),), 1.0 / total),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transitions", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=120)
    ap.add_argument("--response", type=int, default=24)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = default_tiny_model()
    batch = make_batch(args.transitions, args.prompt, args.response, 1000)
    cfg = TorchBackendConfig(lr=1e-5, old_logprobs="sampled")
    ours = TorchBackend(AutoModelForCausalLM.from_pretrained(path), cfg)
    model = AutoModelForCausalLM.from_pretrained(path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    prepared = prepare(batch, cfg.micro_batch_tokens)
    ours.update(batch)  # warm-up both paths
    floor_step(model, opt, prepared)
    t_ours: list[float] = []
    t_floor: list[float] = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        floor_step(model, opt, prepared)
        t_floor.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ours.update(batch)
        t_ours.append(time.perf_counter() - t0)
    tokens = sum(len(t.response_ids) for t in batch)
    mo, mf = statistics.median(t_ours), statistics.median(t_floor)
    print("| transitions | tokens (resp) | floor s | update s | ratio | update tokens/s |")
    print("|---|---|---|---|---|---|")
    print(f"| {len(batch)} | {tokens} | {mf:.3f} | {mo:.3f} | {mo / mf:.2f}x | {tokens / mo:.0f} |")


if __name__ == "__main__":
    main()
