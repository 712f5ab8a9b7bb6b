"""Train the AutoGen Calc-X agent with LightningRL.

CPU (default): the tiny local model, a staged warm start on demonstrations written in AutoGen's own
requests (it learns to use the calculator, then the habit of answering from memory), then GRPO on
generated one-step word problems, validated greedily on 100 held-out ones. Nothing is downloaded:

    uv run python examples/calc_agent/train.py --seed 0 --out runs/calc_agent

GPU, real model, real Calc-X files (JSON lines with question/result; the loader is load_calcx):

    uv run python examples/calc_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --warm-start-steps 0 --train-file calcx/train.jsonl --val-file calcx/validation.jsonl \\
        --steps 200 --batch-size 32 --group-size 8 --max-tokens 512 --lr 1e-6 --val-temperature 0.7

Metrics go to <out>/metrics.jsonl (and reward_curve.png), the warm start's probes to
<out>/warm_start/warm_start.json; AIR gives each model call whose calculator call failed
--tool-error-reward (default -0.1).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the example's own modules

from calc_autogen_agent import calc_agent  # noqa: E402
from calc_tasks import load_calcx, problem_key, split_tasks  # noqa: E402
from calc_warm_start import WarmStartSettings, warm_start  # noqa: E402

from lightning_rl import Trainer, TrainerConfig  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402

__all__ = ["main"]


def main(argv: list[str] | None = None) -> float | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (local, CPU) or an HF model name/folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", default="runs/calc_agent", help="run folder (metrics.jsonl, checkpoints)")
    parser.add_argument("--steps", type=int, default=12, help="RL steps")
    parser.add_argument("--batch-size", type=int, default=16, help="tasks per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion budget per model call")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of training rollouts")
    parser.add_argument(
        "--val-temperature", type=float, default=0.0, help="held-out decoding (0: greedy, a property of the weights)"
    )
    parser.add_argument("--lr", type=float, default=3e-4, help="RL learning rate (1e-6 suits a 0.5B model)")
    parser.add_argument("--val-every", type=int, default=4, help="validate every N steps (0: before/after only)")
    parser.add_argument("--tool-error-reward", type=float, default=-0.1, help="AIR reward of a failed tool call")
    parser.add_argument("--train-file", help="Calc-X JSON lines for training (default: generated problems)")
    parser.add_argument("--val-file", help="Calc-X JSON lines for validation (default: generated problems)")
    parser.add_argument("--n-train", type=int, default=300, help="generated training problems")
    parser.add_argument("--n-val", type=int, default=100, help="generated held-out problems")
    parser.add_argument("--n-probe", type=int, default=100, help="generated problems that only probe the warm start")
    parser.add_argument(
        "--warm-start-steps",
        type=int,
        default=2000,
        help="most skill steps of the tiny model's warm start (it stops once the probes pass; 0: no warm start)",
    )
    parser.add_argument("--polish-steps", type=int, default=150, help="warm-start steps at a decaying rate")
    parser.add_argument("--habit-steps", type=int, default=200, help="most warm-start steps on the sloppy demonstrator")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    train, val, probe = split_tasks(args.n_train, args.n_val, args.n_probe, seed=args.seed)
    out = Path(args.out)
    model = args.model
    if args.warm_start_steps > 0 and not args.train_file:
        from lightning_rl.trainer.services import resolve_model

        settings = WarmStartSettings(
            seed=args.seed,
            expert_steps=args.warm_start_steps,
            polish_steps=args.polish_steps,
            habit_steps=args.habit_steps,
            progress=not args.quiet,
        )
        exclude = {problem_key(t.input["expression"]) for t in (*val, *probe)}
        warm = warm_start(resolve_model(model), out / "warm_start", train, probe, exclude=exclude, settings=settings)
        model = str(warm)
    elif args.warm_start_steps > 0:
        print("warm start skipped: demonstrations need generated problems (with their expressions)")
    if args.train_file:
        train = load_calcx(args.train_file)
    if args.val_file:
        val = load_calcx(args.val_file)
    config = TrainerConfig(
        model=model,
        device=args.device,
        run_dir=str(out),
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        val_temperature=args.val_temperature,
        val_every=args.val_every,
        air={"tool_error": args.tool_error_reward},
        seed=args.seed,
        progress=not args.quiet,
        concurrency=args.batch_size * args.group_size,
        backend=TorchBackendConfig(lr=args.lr, seed=args.seed, old_logprobs="sampled", temperature=args.temperature),
    )
    result = Trainer(config).fit(calc_agent, train, val)
    print(f"held-out reward: {result.val_before} -> {result.val_after}; metrics in {out / 'metrics.jsonl'}")
    return result.val_after


if __name__ == "__main__":
    main()
