"""``--seed`` repeats a run: derived sampling seeds, and the deterministic mode's identical metrics.

Real components throughout: the tiny model, the engine behind the real gateway, the demo's
multi-turn calculator agent on the plain ``openai`` client, the SQLite store, the torch update.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from lightning_rl.agent import LLM
from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.seeding import CallSeeds, derive_seed
from lightning_rl.trainer import Trainer, TrainerConfig
from lightning_rl.types import Task

_TIMING = re.compile(r"(_s$|per_s$|_seconds$|^mem/)")
"""Keys that measure the machine, not the run: wall-clock figures and peak memory."""


async def two_turn_agent(task: dict[str, Any], llm: LLM) -> float:
    """Two chat calls, the second sent the first's answer; the reward depends on what was sampled, so
    groups have variance (the untrained tiny model never answers right)."""
    client = llm.async_openai_client(max_retries=0)
    messages: list[Any] = [{"role": "user", "content": task["q"]}]
    try:
        first = await client.chat.completions.create(model=llm.model, messages=messages, **dict(llm.sampling))
        messages += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
        messages += [{"role": "user", "content": "and then?"}]
        second = await client.chat.completions.create(model=llm.model, messages=messages, **dict(llm.sampling))
    finally:
        await client.close()
    return (len(second.choices[0].message.content or "") % 5) / 4


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every metrics.jsonl row without its timings and memory peaks (they differ between any two runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not _TIMING.search(k) and k != "time"} for row in rows]


def _config(run_dir: Path, model: Path, **overrides: Any) -> TrainerConfig:
    settings: dict[str, Any] = {
        "model": str(model),
        "run_dir": str(run_dir),
        "steps": 2,
        "batch_size": 3,
        "group_size": 4,
        "max_tokens": 12,
        "val_every": 0,
        "temperature": 1.0,
        "tensorboard": False,
        "progress": False,
        "seed": 7,
        "backend": TorchBackendConfig(lr=1e-2, old_logprobs="sampled", seed=7),
    }
    return TrainerConfig(**{**settings, **overrides})


def test_seeds_depend_on_run_seed_rollout_and_call_not_on_the_run_id() -> None:
    a, b = CallSeeds(3, rollout_prefix="run1-"), CallSeeds(3, rollout_prefix="run2-")
    first = [a.next_seed("run1-s1-t0-0", "at-1") for _ in range(3)]
    assert first == [b.next_seed("run2-s1-t0-0", "at-9") for _ in range(3)]  # another run, same seeds
    assert len(set(first)) == 3  # each call of an attempt draws differently
    assert a.next_seed("run1-s1-t0-1", "at-2") != first[0]  # another rollout
    assert CallSeeds(4, "run1-").next_seed("run1-s1-t0-0", "at-1") != first[0]  # another run seed
    assert derive_seed(3, "s1-t0-0", 0) == first[0] and 0 <= first[0] < 2**63


def test_deterministic_mode_gives_identical_metrics_for_one_seed(tmp_path: Path, tiny_model_path: Path) -> None:
    tasks = [Task(input={"q": f"what is {w}?"}) for w in ("tea", "rain", "cats", "dogs", "salt", "wind", "snow")]
    threads = torch.get_num_threads()
    results = [
        Trainer(_config(tmp_path / f"run{i}", tiny_model_path, deterministic=True)).fit(
            two_turn_agent, tasks[:5], tasks[5:]
        )
        for i in range(2)
    ]
    assert torch.get_num_threads() == threads
    first, second = (_metrics(r.run_dir) for r in results)
    train = [row for row in first if "train/loss" in row]
    assert len(train) == 2 and all(row["train/n_rollouts"] == 12 for row in train)
    assert train[0]["train/loss"] != 0.0  # the update ran on real advantages
    assert first == second
    # another seed samples other tokens: the identity above is not an accident of a constant run
    other = Trainer(_config(tmp_path / "other", tiny_model_path, deterministic=True, seed=8)).fit(
        two_turn_agent, tasks[:5], tasks[5:]
    )
    assert _metrics(other.run_dir) != first
