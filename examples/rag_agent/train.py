"""Train the answerer of a two-agent RAG app (OpenAI Agents SDK) with LightningRL.

The app (rag_agent.py) is unchanged SDK code: a planner hands each multi-hop question to an
answerer, which searches a small bundled corpus (BM25) and answers; the reward is F1 plus a format
bonus. The only Lightning line is the plugin call below: ``instrument(trainable=["answerer"])``.
The planner's calls go through the gateway too, but only the answerer's calls are trained.

CPU, tiny local model (default; about 12 minutes on a busy 2-core machine, mostly the warm start):
    uv run python examples/rag_agent/train.py --steps 8

GPU, a real model (downloads it from the Hugging Face hub):
    uv run python examples/rag_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --steps 100 --batch-size 16 --group-size 8 --max-tokens 256 --warm-start-steps 0

``--warm-start-steps`` first fine-tunes the tiny model (supervised) on demonstrations of the whole
flow (handoff, searches, answer), so that RL starts from a model that can use its tools; a real
instruction-tuned model needs none. Metrics land in ``<out>/metrics.jsonl`` (reward curve:
``reward_curve.png``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the example's own modules


from rag_agent import rag_agent  # noqa: E402
from rag_data import load_corpus, make_questions, split  # noqa: E402

from lightning_openai_agents import instrument  # noqa: E402
from lightning_rl import Task, Trainer, TrainerConfig  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (local, CPU) or a Hugging Face model id / folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=int, default=8, help="RL steps")
    parser.add_argument("--batch-size", type=int, default=8, help="questions per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per question (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion budget per model call")
    parser.add_argument("--lr", type=float, default=1e-3, help="RL learning rate")
    parser.add_argument("--n-val", type=int, default=16, help="held-out questions")
    parser.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: before and after)")
    parser.add_argument(
        "--warm-start-steps", type=int, default=150, help="supervised steps on demonstrations first (tiny model only)"
    )
    parser.add_argument("--out", default="runs/rag_agent", help="run folder (metrics.jsonl, reward_curve.png)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float | None:
    args = parse_args(argv)
    instrument(trainable=["answerer"])  # <- the Lightning integration: roles are agent names

    questions = make_questions(load_corpus())
    train_q, val_q = split(questions, args.n_val, seed=args.seed)
    to_task = lambda q: Task(input={"question": q.question, "answer": q.answer})  # noqa: E731
    train_tasks, val_tasks = [to_task(q) for q in train_q], [to_task(q) for q in val_q]

    model = args.model
    if model == "tiny":
        from lightning_rl.trainer.services import resolve_model

        model = str(resolve_model("tiny"))
        if args.warm_start_steps > 0:
            from rag_warm_start import warm_start

            model = str(
                warm_start(Path(model), Path(args.out) / "warm_start", train_q, args.warm_start_steps, args.seed)
            )
    config = TrainerConfig(
        model=model,
        run_dir=args.out,
        device=args.device,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        val_every=args.val_every,
        air={"tool_error": -0.1},
        seed=args.seed,
        progress=not args.no_progress,
        concurrency=args.batch_size * args.group_size,
        tensorboard=False,
        backend=TorchBackendConfig(lr=args.lr, seed=args.seed, old_logprobs="sampled"),
    )
    result = Trainer(config).fit(rag_agent, train_tasks, val_tasks)

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.3f}"

    print(f"held-out reward: {fmt(result.val_before)} -> {fmt(result.val_after)}; run folder {result.run_dir}")
    return result.val_after


if __name__ == "__main__":
    main()
