"""Train the answerer of a two-agent RAG app (OpenAI Agents SDK) with LightningRL.

The app (rag_agent.py) is unchanged SDK code: a planner hands each question to an answerer, which
searches a bundled corpus (BM25) and answers; the reward is token F1 plus a format bonus. The only
Lightning line is the plugin call below: ``instrument(trainable=["answerer"])``. The planner's calls
go through the gateway too, but only the answerer's calls are trained.

CPU, tiny local model (default: staged warm start, then 12 GRPO steps on 100 held-out questions):
    uv run python examples/rag_agent/train.py --seed 0 --out runs/rag_agent

GPU, a real model (downloads it from the Hugging Face hub; no warm start):
    uv run python examples/rag_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --steps 100 --batch-size 16 --group-size 8 --max-tokens 256 --warm-start-steps 0

The tiny model first gets the staged warm start (rag_warm_start.py): it learns to search for the
person asked about and copy the fact found, then the habit of answering from memory, so RL starts
from a model that can use its tool but rarely does. ``--warm-start-steps 0`` skips it. Metrics land
in ``<out>/metrics.jsonl`` (reward curve: ``reward_curve.png``; warm start: ``warm_start/warm_start.json``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the example's own modules


from rag_agent import rag_agent  # noqa: E402
from rag_data import Question, load_corpus, make_questions, split  # noqa: E402

from lightning_openai_agents import instrument  # noqa: E402
from lightning_rl import Task, Trainer, TrainerConfig  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402

__all__ = ["main", "parse_args", "to_task"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (local, CPU) or a Hugging Face model id / folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=int, default=12, help="RL steps")
    parser.add_argument("--batch-size", type=int, default=16, help="questions per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per question (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion budget per model call")
    parser.add_argument("--lr", type=float, default=3e-4, help="RL learning rate")
    parser.add_argument("--n-val", type=int, default=100, help="held-out questions (about people never trained on)")
    parser.add_argument("--n-probe", type=int, default=100, help="probe questions (warm-start checks only)")
    parser.add_argument("--val-every", type=int, default=4, help="validate every N steps (0: before and after)")
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=1500,
        help="at most this many expert steps of the staged warm start (tiny model; 0 skips the warm start)",
    )
    parser.add_argument(
        "--warm-only",
        action="store_true",
        help="make the warm start (OUT/warm_start) and stop; later runs reuse it with "
        "--model OUT/warm_start --warm-start-steps 0",
    )
    parser.add_argument("--polish-steps", type=int, default=150, help="warm start: expert steps at a decaying rate")
    parser.add_argument("--habit-steps", type=int, default=200, help="warm start: at most this many habit steps")
    parser.add_argument(
        "--untrainable-roles",
        choices=["frozen", "shared"],
        default="frozen",
        help="frozen: the planner is answered by the starting weights; shared: by the policy under training",
    )
    parser.add_argument(
        "--shared-prefix",
        type=int,
        default=40,
        help="run a prompt prefix of at least this many tokens that an agent's requests share (its system "
        "prompt and tools) once per micro-batch, in the warm start and in RL (0: off)",
    )
    parser.add_argument(
        "--adapters",
        choices=["shared", "per_role"],
        default="shared",
        help="shared: the trainable roles train one set of weights; per_role: each trains its own LoRA adapter "
        "over one frozen base, which answers every other role (docs/adapters.md)",
    )
    parser.add_argument(
        "--lora-rank", type=int, default=8, help="LoRA rank of each role's adapter (--adapters per_role)"
    )
    parser.add_argument(
        "--adapter-lr", type=float, default=3e-3, help="RL learning rate of the adapters (--adapters per_role)"
    )
    parser.add_argument("--tool-error-reward", type=float, default=-0.1, help="AIR tool_error reward (0: AIR off)")
    parser.add_argument("--out", default="runs/rag_agent", help="run folder (metrics.jsonl, reward_curve.png)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the split, the warm start and RL")
    parser.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def to_task(q: Question) -> Task:
    """The trainer's task for a question (the app reads ``question``; the reward needs ``answer``)."""
    return Task(input={"question": q.question, "answer": q.answer})


def main(argv: list[str] | None = None) -> float | None:
    args = parse_args(argv)
    instrument(trainable=["answerer"])  # <- the Lightning integration: roles are agent names

    train_q, val_q, probe_q = split(make_questions(load_corpus()), args.n_val, seed=args.seed, n_probe=args.n_probe)
    model = args.model
    if model == "tiny":
        from lightning_rl.engine.models import resolve_model

        model = str(resolve_model("tiny"))
        if args.warm_start_steps > 0:
            from rag_warm_start import WarmStartConfig, warm_start

            cfg = WarmStartConfig(
                seed=args.seed,
                expert_steps=args.warm_start_steps,
                polish_steps=args.polish_steps,
                habit_steps=args.habit_steps,
                shared_prefix=args.shared_prefix,
                progress=not args.quiet,
            )
            model = str(warm_start(Path(model), Path(args.out) / "warm_start", train_q, probe_q, cfg))
    if args.warm_only:
        print(f"warm start: {model}")
        return None
    air = {"tool_error": args.tool_error_reward} if args.tool_error_reward else {}
    config = TrainerConfig(
        model=model,
        run_dir=args.out,
        device=args.device,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        temperature=1.0,
        val_temperature=0.0,  # greedy held-out decoding: the score is a property of the weights
        val_every=args.val_every,
        air=air,
        untrainable_roles=args.untrainable_roles,
        adapters=args.adapters,
        seed=args.seed,
        progress=not args.quiet,
        concurrency=args.batch_size * args.group_size,
        tensorboard=False,
        backend=TorchBackendConfig(
            lr=args.adapter_lr if args.adapters == "per_role" else args.lr,
            seed=args.seed,
            old_logprobs="sampled",
            temperature=1.0,
            shared_prefix=args.shared_prefix,
            lora_rank=args.lora_rank if args.adapters == "per_role" else 0,
        ),
    )
    result = Trainer(config).fit(rag_agent, [to_task(q) for q in train_q], [to_task(q) for q in val_q])

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    print(f"held-out reward: {fmt(result.val_before)} -> {fmt(result.val_after)}; run folder {result.run_dir}")
    return result.val_after


if __name__ == "__main__":
    main()
