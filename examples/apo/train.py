"""Optimise the short-answer agent's system prompt with APO (automatic prompt optimisation).

The agent (apo_agent.py) is a plain OpenAI client; its only Lightning line reads the system prompt
from the resources its rollout runs with. APO evaluates a beam of candidate prompts on batches of
questions in parallel, has an optimiser LLM critique the failed rollouts and edit the prompt, and
keeps the best-scoring prompts. Settings come from config.toml (the same file ``lightning-rl train``
reads); the options below override it.

Offline (the embedded tiny model as agent model and optimiser; weak, but real; ~2 minutes on CPU):
    uv run python examples/apo/train.py

A hosted optimiser (any OpenAI-compatible endpoint; the key from OPENAI_API_KEY or LIGHTNING_APO_API_KEY):
    uv run python examples/apo/train.py --optimizer-base-url https://api.openai.com/v1 \\
        --optimizer-model gpt-4o-mini --llm-base-url https://api.openai.com/v1 --llm-model gpt-4o-mini

The run folder holds metrics.jsonl (one row per round), reward_curve.png, candidates.json (every
prompt with its parent, critique and scores), best_prompt.txt and store.sqlite.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_rl.algorithms.apo import APO, APOConfig, APOResult
from lightning_rl.types import Task

HERE = Path(__file__).resolve().parent


def resolve(spec: str, folder: Path) -> Any:
    """``"module:attribute"`` with ``folder`` on ``sys.path`` first (the example's own modules)."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=HERE / "config.toml", help="the TOML config (default: ours)")
    parser.add_argument("--rounds", type=int, help="rounds of critique -> edit -> evaluate -> select")
    parser.add_argument("--out", help="run folder (default: the config's run_dir)")
    parser.add_argument("--optimizer-base-url", help="OpenAI-compatible base URL of the optimiser (ends in /v1)")
    parser.add_argument("--optimizer-model", help="the optimiser's model name")
    parser.add_argument("--llm-base-url", help="OpenAI-compatible base URL of the agent's model (default: embedded)")
    parser.add_argument("--llm-model", help="the agent's model name at --llm-base-url")
    parser.add_argument("--no-progress", action="store_true", help="no per-round lines")
    return parser.parse_args(argv)


def load(path: Path) -> tuple[APOConfig, Callable[..., Any], list[Task], list[Task]]:
    """The APO config, the agent and the tasks a config file names."""
    data = tomllib.loads(path.read_text())
    options = dict(data.get("algorithm", {}))
    if options.pop("name", "apo") != "apo":
        raise ValueError(f"{path} configures another algorithm; this script runs APO.")
    folder = path.resolve().parent
    agent = resolve(data["agent"], folder)
    train = list(resolve(data["train_tasks"], folder)())
    val = list(resolve(data["val_tasks"], folder)()) if "val_tasks" in data else []
    return APOConfig(**options), agent, train, val


def main(argv: list[str] | None = None) -> APOResult:
    args = parse_args(argv)
    config, agent, train, val = load(args.config)
    overrides = {
        "rounds": args.rounds,
        "run_dir": args.out,
        "optimizer_base_url": args.optimizer_base_url,
        "optimizer_model": args.optimizer_model,
        "llm_base_url": args.llm_base_url,
        "llm_model": args.llm_model,
        "progress": False if args.no_progress else None,
    }
    for key, value in overrides.items():
        if value is not None:
            setattr(config, key, value)
    config.__post_init__()  # check the overridden values too
    result = APO(config).fit(agent, train, val)
    print(f"held-out reward: {result.val_before:.3f} with the initial prompt -> {result.val_after:.3f}")
    print(f"best prompt (resources version {result.best_version}): {result.best_prompt!r}")
    print(f"run folder: {result.run_dir}")
    return result


if __name__ == "__main__":
    main()
