"""examples/verl: the Hydra config composes over VeRL's own ppo_trainer config and maps onto ours."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("hydra")

from hydra import compose, initialize_config_dir  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verl"


def _train_module() -> Any:
    spec = importlib.util.spec_from_file_location("verl_example_train", EXAMPLE / "train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("nnodes", "gpus"), [(1, 8), (4, 8)])
def test_config_composes_and_maps_onto_lightning_and_verl(nnodes: int, gpus: int) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    with initialize_config_dir(config_dir=str(EXAMPLE), version_base=None):
        cfg = compose(
            config_name="config",
            overrides=[f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={gpus}", "lightning.steps=3"],
        )
    assert cfg.trainer.nnodes == nnodes and cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.hybrid_engine is True
    trainer, backend = _train_module().lightning_configs(cfg)
    assert trainer.steps == 3 and trainer.group_size == 8 and trainer.model == cfg.actor_rollout_ref.model.path
    assert backend.max_response_length == cfg.data.max_response_length and backend.overlong == "error"
    assert backend.temperature == cfg.actor_rollout_ref.rollout.temperature == trainer.temperature
    engine = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout.checkpoint_engine)
    assert engine.backend == "naive"


@pytest.mark.filterwarnings("ignore:Disabled critic:UserWarning")
def test_verl_accepts_the_config() -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=str(EXAMPLE), version_base=None):
        cfg = compose(config_name="config")
    assert not need_reference_policy(cfg) and not need_critic(cfg)  # GRPO without KL: actor + rollout only
    validate_config(config=cfg, use_reference_policy=False, use_critic=False)  # raises on an invalid config


def test_tasks_load_from_the_builtin_demo() -> None:
    train, val = _train_module().load_tasks("calculator", 5, 2)
    assert len(train) == 5 and len(val) == 2
