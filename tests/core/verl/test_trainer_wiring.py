"""The whole loop wired the VeRL way, on CPU: runner -> gateway -> replicas -> adapter -> VerlBackend.

``FakeUpstream`` stands in for VeRL's vLLM replicas, ``FakeActorWorkerGroup`` (real tiny model +
VeRL's ``ppo_loss``) for the actor worker group and ``FakeRolloutControl`` for the checkpoint engine.
Everything else is the real code: SQLite store, runner, gateway, ``ReplicaUpstream``, adapter,
credit assignment, ``VerlBackend`` and ``VerlTrainer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

from lightning_rl.agent import LLM  # noqa: E402
from lightning_rl.backends.verl import VerlBackendConfig, VerlWorkers  # noqa: E402
from lightning_rl.gateway.server import running_gateway  # noqa: E402
from lightning_rl.testing import FakeUpstream  # noqa: E402
from lightning_rl.trainer import TrainerConfig  # noqa: E402
from lightning_rl.trainer.verl import VerlTrainer  # noqa: E402
from lightning_rl.types import Task  # noqa: E402


async def short_agent(task: dict[str, Any], llm: LLM) -> float:
    client = llm.async_openai_client(max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()
    return 1.0 if "yes" in (reply.choices[0].message.content or "") else 0.0


async def test_verl_trainer_runs_steps_through_replicas_and_publishes(
    tmp_path: Path, fake_actor: Any, fake_rollout: Any
) -> None:
    count = {"n": 0}

    def responder(body: dict[str, Any]) -> str:
        count["n"] += 1
        return "yes" if count["n"] % 2 else "no"

    fake_vllm = FakeUpstream(model="policy", responder=responder)
    actor = fake_actor()
    rollout = fake_rollout()
    async with running_gateway(fake_vllm.app) as replica:
        workers = VerlWorkers(actor=actor, dp_size=2, rollout=rollout, server_addresses=[replica])
        config = TrainerConfig(
            model="unused-by-verl",
            run_dir=str(tmp_path / "run"),
            steps=2,
            batch_size=2,
            group_size=2,
            max_tokens=4,
            val_every=0,
            tensorboard=False,
            progress=False,
            rollout_timeout_s=30,
        )
        result = await VerlTrainer(config, workers, VerlBackendConfig(pad_token_id=0)).fit_async(
            short_agent, [Task(input={"q": "a"}), Task(input={"q": "b"})]
        )
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["train/n_rollouts"] == 4 and r["train/failed_rollouts"] == 0 for r in train)
    updated = [r for r in train if r["train/n_updated_transitions"] > 0]
    assert updated and all("train/loss" in r and r["train/verl/rows"] % 2 == 0 for r in updated)
    assert len(actor.losses) == len(updated)
    # start-up publish wakes the replicas (v2), then sleep before each update and sync after it
    assert rollout.calls[0] == ("update_weights", 2)
    assert [c for c in rollout.calls if c[0] == "update_weights"] == [("update_weights", v) for v in (2, 3, 4)]
    assert [r["model_version"] for r in train] == [3, 4]
    assert (result.run_dir / "checkpoints" / "step_00002" / "lightning_state.json").exists()
