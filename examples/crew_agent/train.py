"""Train the researcher of a two-agent CrewAI crew with LightningRL; the writer stays frozen.

CPU, tiny model (the default; builds a small random model locally, no download)::

    uv run python examples/crew_agent/train.py --steps 10

GPU, a real model (any Hugging Face chat model with tool calling in its chat template; downloaded by
transformers unless it is a local folder)::

    uv run python examples/crew_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --steps 50 --batch-size 16 --group-size 8 --max-tokens 256

With the tiny model, ``--warm-start-steps`` first fine-tunes it (supervised) on demonstrations
captured from the real crew (``crew_warm_start.py``): a sloppy demonstrator who looks the price up on
only ``--tool-rate`` of the questions, so RL starts from a model that can use its tool but often
does not. A real instruction-tuned model needs no warm start. The run folder gets ``metrics.jsonl``
(one row per step: reward, loss, ...) and ``reward_curve.png``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from crew_agent import RESEARCHER, crew_agent  # noqa: E402
from crew_tasks import make_tasks  # noqa: E402
from crew_warm_start import warm_start  # noqa: E402

from lightning_crewai import CrewAIInstrumentor  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402
from lightning_rl.trainer import Trainer, TrainerConfig  # noqa: E402
from lightning_rl.trainer.services import resolve_model  # noqa: E402


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the docstring's command lines as written, and show each option's default."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    p.add_argument("--model", default="tiny", help="'tiny' (built locally), an HF model folder or hub name")
    p.add_argument("--device", default="cpu", help="torch device for the policy: cpu or cuda")
    p.add_argument("--out", default="runs/crew_agent", help="run folder (metrics.jsonl, reward_curve.png)")
    p.add_argument("--steps", type=int, default=10, help="training steps")
    p.add_argument("--batch-size", type=int, default=4, help="tasks per step")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per task (GRPO group)")
    p.add_argument("--max-tokens", type=int, default=48, help="completion budget of each model call")
    p.add_argument("--lr", type=float, default=3e-4, help="RL learning rate")
    p.add_argument("--n-train", type=int, default=64, help="training questions")
    p.add_argument("--n-val", type=int, default=8, help="held-out questions (validated before and after)")
    p.add_argument("--tool-error", type=float, default=-0.1, help="AIR reward per failed tool call")
    p.add_argument(
        "--warm-start-steps", type=int, default=800, help="supervised steps on demonstrations first (tiny model only)"
    )
    p.add_argument("--tool-rate", type=float, default=0.5, help="how often the warm start's demonstrator uses its tool")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> float | None:
    """Train; returns the mean reward of the last step (None if no step reported one)."""
    args = parse_args(argv)
    # CrewAI warns on every call to a server it cannot count tokens for (the gateway); once is enough.
    logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)
    # The one line the crew needs: route and record CrewAI, train only the researcher.
    CrewAIInstrumentor().instrument(trainable=[RESEARCHER])
    tasks = make_tasks(args.n_train + args.n_val, seed=args.seed)
    train_tasks, val_tasks = tasks[: args.n_train], tasks[args.n_train :]
    model = args.model
    if model == "tiny":
        model = str(resolve_model("tiny"))
        if args.warm_start_steps > 0:
            warm = warm_start(
                Path(model),
                Path(args.out) / "warm_start",
                train_tasks,
                steps=args.warm_start_steps,
                tool_rate=args.tool_rate,
                seed=args.seed,
            )
            model = str(warm)
    config = TrainerConfig(
        model=model,
        device=args.device,
        run_dir=args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        val_every=0,
        air={"tool_error": args.tool_error},
        concurrency=args.batch_size * args.group_size,
        seed=args.seed,
        progress=not args.quiet,
        backend=TorchBackendConfig(lr=args.lr, seed=args.seed, old_logprobs="sampled"),
    )
    result = Trainer(config).fit(crew_agent, train_tasks, val_tasks)
    rewards = [row["train/reward_mean"] for row in result.history if "train/reward_mean" in row]
    print(f"held-out reward: before {result.val_before}, after {result.val_after}; run folder {result.run_dir}")
    return rewards[-1] if rewards else None


if __name__ == "__main__":
    main()
