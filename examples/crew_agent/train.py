"""Train the researcher of a two-agent CrewAI crew with LightningRL; the writer stays frozen.

CPU, tiny model (the default; builds a small random model locally, no download, with a tokenizer that
also learnt CrewAI's prompt text)::

    uv run python examples/crew_agent/train.py --seed 0 --out runs/crew_agent

GPU, a real model (any Hugging Face chat model with tool calling in its chat template; downloaded by
transformers unless it is a local folder)::

    uv run python examples/crew_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --warm-start-steps 0 --steps 50 --max-tokens 256

The catalogue's items are dealt out to training, held-out (``--n-val``) and probe (``--n-probe``)
sets, so every held-out question asks about an item never seen in training. With the tiny model,
a staged warm start (``crew_warm_start.py``) first teaches the crew's format and skills on
demonstrations captured from the real crew, then the habit of answering from memory; GRPO then
discovers that looking the price up pays. A real instruction-tuned model needs no warm start
(``--warm-start-steps 0``). The run folder gets ``metrics.jsonl`` (held-out reward before, every
``--val-every`` steps and after; reward, loss, per-role figures per step), ``reward_curve.png`` and
``warm_start/warm_start.json``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from crew_agent import RESEARCHER, crew_agent  # noqa: E402
from crew_tasks import make_tasks, split_items  # noqa: E402
from crew_warm_start import WarmStartSettings, crew_tiny_model, staged_config, warm_start  # noqa: E402

from lightning_crewai import CrewAIInstrumentor  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402
from lightning_rl.trainer import Trainer, TrainerConfig  # noqa: E402


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep the docstring's command lines as written, and show each option's default."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_Formatter)
    p.add_argument("--model", default="tiny", help="'tiny' (built locally), an HF model folder or hub name")
    p.add_argument("--device", default="cpu", help="torch device for the policy: cpu or cuda")
    p.add_argument("--out", default="runs/crew_agent", help="run folder (metrics.jsonl, reward_curve.png)")
    p.add_argument("--steps", type=int, default=8, help="RL steps")
    p.add_argument(
        "--batch-size", type=int, default=8, help="questions per step (each a CrewAI crew run --group-size times)"
    )
    p.add_argument("--group-size", type=int, default=8, help="rollouts per question (GRPO group)")
    p.add_argument("--max-tokens", type=int, default=48, help="completion budget of each model call")
    p.add_argument("--lr", type=float, default=3e-4, help="RL learning rate")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of training rollouts")
    p.add_argument("--val-every", type=int, default=0, help="validate every this many steps (0: before and after)")
    p.add_argument("--n-train", type=int, default=180, help="training questions (cycling through the training items)")
    p.add_argument("--n-val", type=int, default=100, help="held-out questions, one per held-out item")
    p.add_argument("--n-probe", type=int, default=40, help="probe items: they only check the warm start's skills")
    p.add_argument(
        "--tool-error-reward",
        "--tool-error",
        type=float,
        default=-0.1,
        help="AIR reward per failed tool call (0: AIR off)",
    )
    p.add_argument(
        "--recovered-error-reward",
        type=float,
        default=0.0,
        help="AIR reward for a failed lookup the researcher then gets right (a misspelt name, then the "
        "suggested one): the expert's path, not a dead end (default 0: not charged)",
    )
    p.add_argument(
        "--warm-start-steps",
        type=int,
        default=1500,
        help="most expert steps of the staged warm start (tiny model only; 0 skips the warm start)",
    )
    p.add_argument(
        "--shared-prefix",
        type=int,
        default=16,
        help="run a prompt prefix of at least this many tokens that an agent's requests share (its system "
        "prompt) once per micro-batch, in the warm start and in RL (0: off)",
    )
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=2048,
        help="padded tokens per forward pass, in the warm start and in RL: smaller micro-batches pad "
        "requests of different lengths less",
    )
    p.add_argument("--habit-tool-rate", type=float, default=0.3, help="how often the habit's demonstrator looks up")
    p.add_argument("--seed", type=int, default=0, help="seeds the item split, the warm start and RL")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> float | None:
    """Train; returns the held-out reward after training (None without held-out questions)."""
    args = parse_args(argv)
    # CrewAI warns on every call to a server it cannot count tokens for (the gateway); once is enough.
    logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)
    # The one line the crew needs: route and record CrewAI, train only the researcher.
    CrewAIInstrumentor().instrument(trainable=[RESEARCHER])
    items = split_items(seed=args.seed, n_val=args.n_val, n_probe=args.n_probe)
    train_tasks = make_tasks(items.train, args.n_train, seed=args.seed)
    val_tasks = make_tasks(items.val, seed=args.seed + 1)
    model = args.model
    if model == "tiny":
        model = str(crew_tiny_model())  # its tokenizer also learnt CrewAI's prompt text (crew_warm_start.py)
        if args.warm_start_steps > 0:
            probe_tasks = make_tasks(items.probe, seed=args.seed + 2)
            warm = warm_start(
                Path(model),
                Path(args.out) / "warm_start",
                train_tasks,
                probe_tasks,
                config=staged_config(
                    seed=args.seed,
                    expert_steps=args.warm_start_steps,
                    shared_prefix=args.shared_prefix,
                    micro_batch_tokens=args.micro_batch_tokens,
                    progress=not args.quiet,
                ),
                settings=WarmStartSettings(habit_tool_rate=args.habit_tool_rate),
            )
            model = str(warm.model_dir)
    config = TrainerConfig(
        model=model,
        device=args.device,
        run_dir=args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        val_temperature=0.0,  # held-out questions decoded greedily: the score is the weights', not the draw's
        val_every=args.val_every,
        air={"tool_error": args.tool_error_reward, "tool_error_recovered": args.recovered_error_reward},
        concurrency=args.batch_size * args.group_size,
        seed=args.seed,
        progress=not args.quiet,
        backend=TorchBackendConfig(
            lr=args.lr,
            seed=args.seed,
            old_logprobs="sampled",
            temperature=args.temperature,
            shared_prefix=args.shared_prefix,
            micro_batch_tokens=args.micro_batch_tokens,
        ),
    )
    result = Trainer(config).fit(crew_agent, train_tasks, val_tasks)
    print(f"held-out reward: before {result.val_before}, after {result.val_after}; run folder {result.run_dir}")
    return result.val_after


if __name__ == "__main__":
    main()
