"""Fixtures of the VeRL backend tests: transitions recorded by one real CPU step of the LightningRL loop.

Tests that need ``verl`` skip where it is not installed (the project's default environment);
run it from a venv with ``lightning-rl[train]`` and ``verl==0.9.1`` (see docs/verl.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")


@dataclass
class RecordedRun:
    """What one real training step left behind, re-read from its store."""

    samples: list[Any]  # list[RolloutSample], fresh copies (tests mutate advantages)
    pad_token_id: int
    model_path: Path


async def length_agent(task: dict[str, Any], llm: Any) -> float:
    """Two chat calls through the real gateway; the reward depends on what was sampled."""
    client = llm.async_openai_client(max_retries=0)
    try:
        first = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
        text = first.choices[0].message.content or ""
        second = await client.chat.completions.create(
            model=llm.model,
            messages=[
                {"role": "user", "content": task["q"]},
                {"role": "assistant", "content": text},
                {"role": "user", "content": "again"},
            ],
            **dict(llm.sampling),
        )
    finally:
        await client.close()
    return ((len(text) + len(second.choices[0].message.content or "")) % 5) / 4


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> RecordedRun:
    """One GRPO step of the real Trainer (tiny model, real gateway, SQLite store) on CPU."""
    from lightning_rl.backends.torch_backend import TorchBackendConfig
    from lightning_rl.engine.tiny import default_tiny_model
    from lightning_rl.store.sqlite import SQLiteStore
    from lightning_rl.trainer import Trainer, TrainerConfig
    from lightning_rl.trainer.loop import collect_samples
    from lightning_rl.types import Task

    model = default_tiny_model()
    run_dir = tmp_path_factory.mktemp("verl-run") / "run"
    config = TrainerConfig(
        model=str(model),
        run_dir=str(run_dir),
        steps=1,
        batch_size=2,
        group_size=3,
        max_tokens=6,
        val_every=0,
        tensorboard=False,
        progress=False,
        rollout_timeout_s=30,
        backend=TorchBackendConfig(lr=1e-3),
    )
    tasks = [Task(input={"q": "say something about cats"}), Task(input={"q": "tea or rain?"})]
    Trainer(config).fit(length_agent, tasks)

    async def read() -> list[Any]:
        store = SQLiteStore(run_dir / "store.sqlite")
        try:
            rollouts = await store.query_rollouts(mode="train", limit=100)
            collected = await collect_samples(store, rollouts, trainable=None, air={})
            return collected.samples
        finally:
            await store.close()

    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(model)
    return RecordedRun(samples=asyncio.run(read()), pad_token_id=int(tok.pad_token_id or 0), model_path=model)


@pytest.fixture
def samples(recorded_run: RecordedRun) -> list[Any]:
    """Deep copies of the recorded rollout samples (advantages are written into them)."""
    import copy

    return copy.deepcopy(recorded_run.samples)


if importlib.util.find_spec("verl") is not None:
    import torch
    from tensordict import TensorDict
    from transformers import AutoModelForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig
    from verl.workers.utils.losses import ppo_loss

    class FakeActorWorkerGroup:
        """A fake of VeRL's actor worker group: one CPU 'rank' holding the real tiny model."""

        def __init__(self, model_path: Path) -> None:
            self.model: Any = AutoModelForCausalLM.from_pretrained(model_path).float()
            self.received: list[TensorDict] = []
            self.losses: list[float] = []
            self.saved: list[str] = []
            self.loaded: list[str] = []
            self.config = ActorConfig(
                strategy="fsdp", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_c=1e9, rollout_n=1
            )

        def _token_logprobs(self, td: TensorDict) -> torch.Tensor:
            """Per-position logprob of the next token over the unpadded sequences (VeRL's model output layout)."""
            out: list[torch.Tensor] = []
            for ids in td["input_ids"].unbind():
                logits = self.model(input_ids=ids[None]).logits[0].float()
                logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None])[:, 0]
                out.append(torch.cat([logp, logp.new_zeros(1)]))
            return torch.nested.as_nested_tensor(out, layout=torch.jagged)

        def compute_log_prob(self, data: TensorDict) -> TensorDict:
            self.received.append(data)
            with torch.no_grad():
                return tu.get_tensordict({"log_probs": self._token_logprobs(data)})

        def compute_ref_log_prob(self, data: TensorDict) -> TensorDict:
            return self.compute_log_prob(data)

        def update_actor(self, data: TensorDict) -> TensorDict:
            self.received.append(data)
            assert tu.get(data, "compute_loss") is True
            tu.assign_non_tensor(
                data, dp_size=1, batch_num_tokens=int(data["response_mask"].sum()), global_batch_size=None
            )
            loss, metrics = ppo_loss(self.config, {"log_probs": self._token_logprobs(data)}, data)
            assert "actor/pg_loss" in metrics and "actor/pg_clipfrac" in metrics
            loss.backward()
            self.losses.append(float(loss.detach()))
            return tu.get_tensordict({}, non_tensor_dict={"metrics": {"actor/pg_loss": [float(loss.detach())]}})

        def save_checkpoint(
            self,
            local_path: str,
            hdfs_path: str | None = None,
            global_step: int = 0,
            max_ckpt_to_keep: int | None = None,
        ) -> None:
            self.saved.append(local_path)

        def load_checkpoint(
            self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False
        ) -> None:
            self.loaded.append(local_path)

    class FakeRolloutControl:
        """A fake of VeRL's CheckpointEngineManager: records the calls in order."""

        def __init__(self) -> None:
            self.calls: list[tuple[str, int | None]] = []

        def update_weights(self, global_steps: int | None = None) -> None:
            self.calls.append(("update_weights", global_steps))

        def sleep_replicas(self) -> None:
            self.calls.append(("sleep_replicas", None))

    @pytest.fixture
    def fake_actor(recorded_run: RecordedRun) -> Callable[[], FakeActorWorkerGroup]:
        """Builds a ``FakeActorWorkerGroup`` over the recorded run's tiny model."""
        return lambda: FakeActorWorkerGroup(recorded_run.model_path)

    @pytest.fixture
    def fake_rollout() -> Callable[[], FakeRolloutControl]:
        return FakeRolloutControl
