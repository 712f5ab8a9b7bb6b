"""Train an agent with LightningRL on VeRL (Ray + FSDP actor + vLLM rollout replicas).

Usage (GPUs and vLLM required; see docs/verl.md and launch.sh):

    python examples/verl/train.py                                   # 1 node x 8 GPUs, config.yaml
    python examples/verl/train.py actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct lightning.steps=50
    python examples/verl/train.py --cfg job                         # print the composed config, start nothing

The agent (``lightning.agent``, ``module:function``) is the user's unchanged code: it only sees the
gateway URL in ``llm.base_url``. VeRL's vLLM replicas serve it through the gateway; VeRL's actor
trains on the transitions the gateway recorded. On a CPU machine use the embedded trainer instead
(``lightning_rl.trainer.Trainer``, the tiny model): VeRL needs GPUs.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from lightning_rl.backends.verl import VerlBackendConfig, start_verl_workers
from lightning_rl.trainer import TrainerConfig
from lightning_rl.trainer.verl import VerlTrainer
from lightning_rl.types import Task


def load_agent(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def load_tasks(spec: str, n_train: int, n_val: int) -> tuple[list[Task], list[Task]]:
    if spec == "calculator":
        from lightning_rl.demo.calculator import split_tasks

        return split_tasks(n_train, n_val, seed=0)
    rows = [Task.model_validate(json.loads(line)) for line in Path(spec).read_text().splitlines() if line.strip()]
    return rows[n_val:][:n_train], rows[:n_val]


def lightning_configs(cfg: DictConfig) -> tuple[TrainerConfig, VerlBackendConfig]:
    """Our two config objects from the ``lightning`` section (VeRL's keys stay with VeRL)."""
    section: dict[str, Any] = OmegaConf.to_container(cfg.lightning, resolve=True)  # type: ignore[assignment]
    backend: dict[str, Any] = section.pop("backend")
    for key in ("agent", "tasks", "n_train", "n_val"):
        section.pop(key)
    trainer = TrainerConfig(model=str(cfg.actor_rollout_ref.model.path), device="cuda", **section)
    if not cfg.actor_rollout_ref.actor.use_dynamic_bsz:  # VeRL then needs whole micro-batches on every rank
        backend.setdefault("micro_batch_size", int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu))
    return trainer, VerlBackendConfig(temperature=trainer.temperature, **backend)


@hydra.main(config_path=".", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    trainer_config, backend_config = lightning_configs(cfg)
    train, val = load_tasks(str(cfg.lightning.tasks), int(cfg.lightning.n_train), int(cfg.lightning.n_val))
    workers = start_verl_workers(cfg)
    try:
        from transformers import AutoTokenizer

        tokenizer: Any = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
        backend_config.pad_token_id = int(tokenizer.pad_token_id or 0)
        result = VerlTrainer(trainer_config, workers, backend_config).fit(load_agent(cfg.lightning.agent), train, val)
        print(f"held-out reward {result.val_before} -> {result.val_after}; metrics in {result.run_dir}/metrics.jsonl")
    finally:
        if workers.shutdown is not None:
            workers.shutdown()


if __name__ == "__main__":
    main()
