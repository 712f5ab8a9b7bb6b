"""Train the AutoGen Calc-X agent with LightningRL.

CPU (default): the tiny local model, a short supervised warm start on synthetic demonstrations (so
the random model knows the tool-call format), then GRPO on generated word problems. Nothing is
downloaded; a few minutes on 2 cores. The reward curve is whatever the tiny model manages:

    uv run python examples/calc_agent/train.py
    uv run python examples/calc_agent/train.py --steps 20 --out runs/calc_agent

GPU, real model, real Calc-X files (JSON lines with question/result; the loader is load_calcx):

    uv run python examples/calc_agent/train.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda \\
        --warm-start-steps 0 --train-file calcx/train.jsonl --val-file calcx/validation.jsonl \\
        --steps 200 --batch-size 32 --group-size 8 --max-tokens 512 --lr 1e-6

Metrics go to <out>/metrics.jsonl (and reward_curve.png); AIR gives each model call whose
calculator call failed --tool-error-reward (default -0.1).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the example's own modules

from calc_autogen_agent import SYSTEM_PROMPT, calc_agent, calculator  # noqa: E402
from calc_tasks import load_calcx, make_tasks  # noqa: E402

from lightning_rl import Task, Trainer, TrainerConfig  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402


def tool_schema() -> dict[str, Any]:
    """The calculator tool as AutoGen sends it to the model (OpenAI function format)."""
    from autogen_core.tools import FunctionTool

    schema = FunctionTool(calculator, description=calculator.__doc__ or "").schema
    function: dict[str, Any] = {"name": schema["name"], "description": schema.get("description", "")}
    function["parameters"] = schema.get("parameters", {})
    return {"type": "function", "function": function}


def demonstrations(tasks: Sequence[Task], *, tool_rate: float, seed: int) -> list[tuple[list[dict[str, Any]], str]]:
    """(chat so far, next assistant text) pairs in the messages AutoGen sends: with probability
    ``tool_rate`` the demonstrator calls the calculator and reports its result, otherwise it
    guesses from memory (wrong: what RL has to unlearn)."""
    rng = random.Random(seed)
    out: list[tuple[list[dict[str, Any]], str]] = []
    for task in tasks:
        data: dict[str, Any] = task.input
        base = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": data["question"]}]
        if rng.random() < tool_rate:
            arguments = json.dumps({"expression": data["expression"]})
            out.append((base, f'<tool_call>{{"name": "calculator", "arguments": {arguments}}}</tool_call>'))
            call = {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": arguments}}
            history = [
                *base,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_0", "content": calculator(data["expression"])},
            ]
            out.append((history, f"The answer is {data['answer']}."))
        else:
            out.append((base, f"The answer is {int(data['answer']) + rng.choice([-1, 1]) * rng.randint(1, 9)}."))
    return out


def warm_start(model: str, out_dir: Path, tasks: Sequence[Task], *, steps: int, tool_rate: float, seed: int) -> Path:
    """Supervised warm start of ``model`` on demonstrations of ``tasks``; saves an HF folder at ``out_dir``."""
    from lightning_rl.trainer.services import resolve_model
    from lightning_rl.trainer.warm_start import sft_on_chats

    tools = [tool_schema()]
    demos = [(chat, tools, text) for chat, text in demonstrations(tasks, tool_rate=tool_rate, seed=seed)]
    done = sft_on_chats(
        resolve_model(model),
        out_dir,
        demos,
        steps=steps,
        seed=seed,
        batch_size=16,
        warmup_steps=min(20, steps // 5),
        final_lr_fraction=1.0,
    )
    (out_dir / "warm_start.json").write_text(json.dumps({"steps": steps, "final_losses": done.losses[-5:]}))
    return out_dir


def main(argv: list[str] | None = None) -> float | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="'tiny' (local, CPU) or an HF model name/folder")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--out", default="runs/calc_agent", help="run folder (metrics.jsonl, checkpoints)")
    parser.add_argument("--steps", type=int, default=12, help="RL steps")
    parser.add_argument("--batch-size", type=int, default=8, help="tasks per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per task (GRPO group)")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion budget per model call")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-3, help="RL learning rate (1e-6 suits a 0.5B model)")
    parser.add_argument("--val-every", type=int, default=0, help="validate every N steps (0: before/after only)")
    parser.add_argument("--tool-error-reward", type=float, default=-0.1, help="AIR reward of a failed tool call")
    parser.add_argument("--train-file", help="Calc-X JSON lines for training (default: generated problems)")
    parser.add_argument("--val-file", help="Calc-X JSON lines for validation (default: generated problems)")
    parser.add_argument("--n-train", type=int, default=200, help="generated training problems")
    parser.add_argument("--n-val", type=int, default=32, help="generated validation problems")
    parser.add_argument(
        "--warm-start-steps", type=int, default=300, help="supervised warm-start steps on the tiny model (0: none)"
    )
    parser.add_argument("--warm-start-tool-rate", type=float, default=0.6, help="how often demonstrations use the tool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    generated = make_tasks(args.n_train + args.n_val, seed=args.seed)
    train = load_calcx(args.train_file) if args.train_file else generated[: args.n_train]
    val = load_calcx(args.val_file) if args.val_file else generated[args.n_train :]
    out = Path(args.out)
    model = args.model
    if args.warm_start_steps > 0:
        if not args.train_file:
            model = str(
                warm_start(
                    model,
                    out / "warm_start",
                    generated[: args.n_train],
                    steps=args.warm_start_steps,
                    tool_rate=args.warm_start_tool_rate,
                    seed=args.seed,
                )
            )
        else:
            print("warm start skipped: demonstrations need generated problems (with their expressions)")
    config = TrainerConfig(
        model=model,
        device=args.device,
        run_dir=str(out),
        steps=args.steps,
        batch_size=args.batch_size,
        group_size=args.group_size,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
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
