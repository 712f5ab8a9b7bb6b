"""A store filled by a real short training run (tiny model, real gateway and runner), shared by the
dashboard tests: built once per session, read-only afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("fastapi")


def train_small_run(run_dir: Path) -> Path:
    """Two GRPO steps of the two-role agent with an AIR policy; returns the run folder."""
    from lightning_rl.backends.torch_backend import TorchBackendConfig
    from lightning_rl.engine.tiny import default_tiny_model
    from lightning_rl.trainer import Trainer, TrainerConfig
    from lightning_rl.types import Task

    from .run_agent import two_role_agent

    cfg = TrainerConfig(
        model=str(default_tiny_model()),
        run_dir=str(run_dir),
        steps=2,
        batch_size=2,
        group_size=3,
        max_tokens=8,
        val_every=0,
        tensorboard=False,
        progress=False,
        rollout_timeout_s=60,
        air={"tool_error": -0.1},
        backend=TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
    )
    tasks = [Task(input={"q": f"say something about {w}"}) for w in ("cats", "dogs", "rain")]
    Trainer(cfg).fit(two_role_agent, tasks, val_tasks=tasks[:2])
    return run_dir


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_small_run(tmp_path_factory.mktemp("dashboard") / "run")
