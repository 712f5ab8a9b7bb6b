"""VeRL's real FSDP actor worker group on CPU (world size 1 and 2), driven by the LightningRL loop for two steps.

Nothing VeRL-side is faked: ``ActorRolloutRefWorker`` (role ``actor``) runs in a Ray worker
process on a local Ray instance, FSDP2 over a gloo process group, selected through VeRL's platform
registry (``lightning_rl.backends.verl.cpu``); its ``update_actor`` computes the update and its
checkpoint engine (``FileCheckpointEngine``, ``replicas.py``) publishes the weights. A LightningRL
gateway over the embedded engine stands in for a vLLM replica (same OpenAI fields, exact token
ids) behind ``ReplicaUpstream``. Starting Ray and the worker takes a minute or more on a small
machine, hence ``slow``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from pathlib import Path
from typing import Any, Literal

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")
pytest.importorskip("hydra")

import torch  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402

from lightning_rl.agent import LLM  # noqa: E402
from lightning_rl.credit import compute_advantages  # noqa: E402
from lightning_rl.trainer import TrainerConfig  # noqa: E402
from lightning_rl.types import Task, Transition  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "verl"


async def answer_hash_agent(task: dict[str, Any], llm: LLM) -> float:
    """One call; the reward, a hash of the answer in [0, 1], differs between any two different answers.

    (Characters mod 4, the reward before, tied across a whole group often enough that CI once saw a
    step with no advantage to train on.)"""
    client = llm.async_openai_client(max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()
    digest = hashlib.sha256((reply.choices[0].message.content or "").encode()).digest()
    return int.from_bytes(digest[:4], "big") / 0xFFFFFFFF


def cpu_verl_config(model: Path, weights_dir: Path, world_size: int) -> Any:
    """The example's VeRL config with the tiny model, an FSDP2 actor in fp32 on ``world_size`` CPU workers."""
    from omegaconf import OmegaConf, open_dict

    from lightning_rl.backends.verl import file_engine_config

    overrides = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",  # VeRL's default: flash_attention_2
        "actor_rollout_ref.actor.strategy=fsdp2",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",  # default bf16
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={world_size}",  # CPU worker processes: FSDP shards over this many gloo ranks
    ]
    with initialize_config_dir(config_dir=str(EXAMPLE), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    with open_dict(cfg):  # the actor publishes weights into the gateways' folder (VeRL's checkpoint-engine keys)
        cfg.actor_rollout_ref.rollout.checkpoint_engine = OmegaConf.merge(
            cfg.actor_rollout_ref.rollout.checkpoint_engine, file_engine_config(weights_dir)
        )
    return cfg


def _hf_logprobs(state: dict[str, torch.Tensor], model_path: Path, transitions: list[Transition]) -> list[list[float]]:
    """Logprobs of each response under the weights in ``state`` (a plain transformers forward)."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_path).float()
    model.load_state_dict(state, strict=False)
    out: list[list[float]] = []
    with torch.no_grad():
        for t in transitions:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            out.append(logp[len(t.prompt_ids) - 1 :].tolist())
    return out


async def _trained_transitions(run_dir: Path, version: int) -> list[Transition]:
    """The transitions sampled at ``version``, with the advantages the step computed (broadcast + GRPO)."""
    from lightning_rl.store.sqlite import SQLiteStore
    from lightning_rl.trainer.loop import collect_samples

    store = SQLiteStore(run_dir / "store.sqlite")
    try:
        rollouts = await store.query_rollouts(mode="train", limit=1000)
        samples = (await collect_samples(store, rollouts, trainable=None, air={})).samples
    finally:
        await store.close()
    transitions = compute_advantages(samples, strategy="broadcast", estimator="grpo")
    # a call that sampled end-of-text at once has no response token: the update leaves it out
    return [t for t in transitions if t.model_version == version and t.response_ids]


@pytest.mark.slow
# world size 2: FSDP shards over two gloo ranks; "recompute": old logprobs from the worker's compute_log_prob
@pytest.mark.parametrize(("world_size", "old_logprobs"), [(1, "sampled"), (2, "recompute")])
# VeRL's imports warn: ray.experimental.state is deprecated, optional engines (megatron, ...) are missing
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
async def test_verl_fsdp_actor_on_cpu_trains_two_lightning_steps_and_publishes(
    tmp_path: Path, world_size: int, old_logprobs: Literal["sampled", "recompute"]
) -> None:
    from transformers import AutoTokenizer

    from lightning_rl.backends.verl import (
        VerlBackend,
        VerlBackendConfig,
        VerlWorkers,
        start_cpu_actor_workers,
    )
    from lightning_rl.backends.verl.replicas import weights_file_name
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.engine.tiny import default_tiny_model
    from lightning_rl.gateway import GatewayConfig, create_gateway_app
    from lightning_rl.gateway.server import running_gateway
    from lightning_rl.trainer.verl import VerlTrainer

    model = default_tiny_model()
    weights_dir = tmp_path / "weights"
    cfg = cpu_verl_config(model, weights_dir, world_size)
    pad = int(AutoTokenizer.from_pretrained(model).pad_token_id or 0)
    engine = TransformersEngine.from_pretrained(model, device="cpu", max_batch_size=8, model_name="policy")
    admin = secrets.token_hex(16)  # the gateway's /admin/weights needs its admin token
    replica_app = create_gateway_app(engine, admin_token=admin, config=GatewayConfig(weights_dir=str(weights_dir)))
    run_dir = tmp_path / "run"
    try:
        async with running_gateway(replica_app) as replica:
            workers = await asyncio.to_thread(start_cpu_actor_workers, cfg, [replica], admin_token=admin)
            try:
                assert workers.dp_size == world_size
                config = TrainerConfig(
                    model=str(model),
                    run_dir=str(run_dir),
                    steps=2,
                    batch_size=2,
                    group_size=4,
                    max_tokens=6,
                    val_every=0,
                    tensorboard=False,
                    progress=False,
                    rollout_timeout_s=120,
                    seed=0,
                )
                tasks = [Task(input={"q": "say something about cats"}), Task(input={"q": "tea or rain?"})]
                backend_config = VerlBackendConfig(
                    pad_token_id=pad,
                    temperature=config.temperature,
                    old_logprobs=old_logprobs,
                    micro_batch_size=int(cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu),
                )
                await VerlTrainer(config, workers, backend_config).fit_async(answer_hash_agent, tasks)
                step2 = await _trained_transitions(run_dir, version=3)
                actor_after = await asyncio.to_thread(
                    VerlBackend(VerlWorkers(actor=workers.actor, dp_size=workers.dp_size), backend_config).logprobs,
                    step2,
                )
            finally:
                if workers.shutdown is not None:
                    workers.shutdown()
            served_version = engine.version
    finally:
        engine.close()

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["train/n_rollouts"] == 8 and r["train/failed_rollouts"] == 0 for r in train)
    assert all(r["train/n_updated_transitions"] > 0 and "train/loss" in r for r in train)
    assert all("train/grad_norm" in r and r["train/grad_norm"] > 0 for r in train)  # VeRL's actor computed them
    # published at start-up (v2) and after each update (v3, v4); rollouts of step 2 were served by v3
    assert [r["model_version"] for r in train] == [3, 4]
    assert served_version == 4
    for version in (2, 3, 4):
        assert (weights_dir / weights_file_name(version)).is_file()

    # the engine served step 2 with exactly the weights VeRL's actor published after step 1
    assert step2 and all(t.response_logprobs for t in step2)
    v3 = torch.load(weights_dir / weights_file_name(3), weights_only=True)
    for sampled, recomputed in zip([t.response_logprobs for t in step2], _hf_logprobs(v3, model, step2), strict=True):
        assert sampled == pytest.approx(recomputed, abs=2e-3)
    # the v4 file holds the actor's weights after step 2
    v4 = torch.load(weights_dir / weights_file_name(4), weights_only=True)
    for ours, actors in zip(_hf_logprobs(v4, model, step2), actor_after, strict=True):
        assert ours == pytest.approx(actors, abs=1e-4)

    # VeRL's update moved the policy's logprobs of the trained tokens the way the advantages say
    moves = [
        (t.advantage, sum(after) - sum(t.response_logprobs or []))
        for t, after in zip(step2, actor_after, strict=True)
        if t.advantage != 0
    ]
    assert moves, "every step-2 group had equal rewards: no advantage to follow"
    assert sum(a * d for a, d in moves) > 0
    ups = [d for a, d in moves if a > 0]
    downs = [d for a, d in moves if a < 0]
    assert sum(ups) / len(ups) > sum(downs) / len(downs)
