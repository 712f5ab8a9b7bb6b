"""The VerlBackend controller on CPU against a fake worker group (the fakes live in conftest.py).

``FakeActorWorkerGroup`` is a stand-in for VeRL's Ray ``ActorRolloutRefWorker`` group (which needs
GPUs): it receives exactly the no-padding ``TensorDict`` VeRL's workers receive, runs the real tiny
model on it, and computes the loss with VeRL's own ``ppo_loss`` (``verl.workers.utils.losses``).
``FakeRolloutControl`` stands in for ``CheckpointEngineManager`` and records sleep/weight-sync calls.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402

from lightning_rl.backends.base import PolicyBackend  # noqa: E402
from lightning_rl.backends.losses import ppo_clip_loss, token_weights  # noqa: E402
from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig  # noqa: E402
from lightning_rl.backends.verl import VerlBackend, VerlBackendConfig, VerlWorkers  # noqa: E402
from lightning_rl.credit import compute_advantages  # noqa: E402
from lightning_rl.types import Transition  # noqa: E402


def _transitions(samples: list[Any]) -> list[Transition]:
    return compute_advantages(samples, strategy="broadcast", estimator="grpo")


def test_verl_backend_is_a_policy_backend_like_the_torch_one(recorded_run: Any, fake_actor: Any) -> None:
    workers = VerlWorkers(actor=fake_actor(), dp_size=1)
    assert isinstance(VerlBackend(workers), PolicyBackend)
    torch_backend = TorchBackend(AutoModelForCausalLM.from_pretrained(recorded_run.model_path))
    assert isinstance(torch_backend, PolicyBackend)


def test_logprobs_through_verls_no_padding_layout_equal_the_torch_backends(
    recorded_run: Any, fake_actor: Any, samples: list[Any]
) -> None:
    transitions = _transitions(samples)
    fake = fake_actor()
    backend = VerlBackend(VerlWorkers(actor=fake, dp_size=1), VerlBackendConfig(pad_token_id=recorded_run.pad_token_id))
    ours = TorchBackend(AutoModelForCausalLM.from_pretrained(recorded_run.model_path)).logprobs(transitions)
    theirs = backend.logprobs(transitions)
    assert len(theirs) == len(transitions)
    for a, b, t in zip(theirs, ours, transitions, strict=True):
        assert len(a) == len(t.response_ids)
        assert a == pytest.approx(b, abs=1e-4)
    # and both equal what the engine sampled with (same weights, temperature 1)
    for a, t in zip(theirs, transitions, strict=True):
        assert a == pytest.approx(t.response_logprobs, abs=1e-3)


def test_update_drives_verl_like_its_trainer_and_matches_our_loss(
    recorded_run: Any, fake_actor: Any, fake_rollout: Any, samples: list[Any]
) -> None:
    transitions = _transitions(samples)
    fake = fake_actor()
    rollout = fake_rollout()
    published: list[int] = []

    async def on_publish(version: int) -> None:
        published.append(version)

    config = VerlBackendConfig(pad_token_id=recorded_run.pad_token_id, mini_batches=1, old_logprobs="sampled")
    backend = VerlBackend(VerlWorkers(actor=fake, dp_size=4, rollout=rollout), config, version=3, on_publish=on_publish)
    metrics = backend.update(transitions)
    # 12 transitions padded to 12 (multiple of dp 4): nothing padded; the actor saw VeRL's layout
    td = fake.received[-1]
    assert td["input_ids"].is_nested and "attention_mask" in td.keys()
    assert tu.get(td, "mini_batch_size") == 12 and tu.get(td, "epochs") == 1
    assert metrics["train/verl/rows"] == 12 and metrics["train/verl/pad_rows"] == 0
    assert rollout.calls == [("sleep_replicas", None)]
    # VeRL's ppo_loss on the real model equals LightningRL's ppo_clip_loss on the same logprobs
    model_logp = TorchBackend(AutoModelForCausalLM.from_pretrained(recorded_run.model_path)).logprobs(transitions)
    lengths = [len(t.response_ids) for t in transitions]
    w = token_weights(lengths, [t.rollout_id for t in transitions], "token")
    terms = ppo_clip_loss(
        torch.tensor([x for row in model_logp for x in row]),
        torch.tensor([x for t in transitions for x in (t.response_logprobs or [])]),
        torch.tensor([t.advantage for t in transitions for _ in t.response_ids]),
        torch.tensor([w[i] for i, n in enumerate(lengths) for _ in range(n)]),
    )
    assert metrics["train/loss"] == pytest.approx(float(terms.loss), abs=1e-5)
    assert fake.losses == [pytest.approx(float(terms.loss), abs=1e-5)]

    import asyncio

    assert asyncio.run(backend.publish()) == 4
    assert rollout.calls[-1] == ("update_weights", 4) and published == [4]


def test_odd_batches_are_padded_not_trimmed(recorded_run: Any, fake_actor: Any, samples: list[Any]) -> None:
    transitions = _transitions(samples)[:3]
    fake = fake_actor()
    config = VerlBackendConfig(pad_token_id=recorded_run.pad_token_id, mini_batches=2)
    metrics = VerlBackend(VerlWorkers(actor=fake, dp_size=2), config).update(transitions)
    assert metrics["train/verl/rows"] == 4 and metrics["train/verl/pad_rows"] == 1
    td = fake.received[-1]
    assert tu.get(td, "mini_batch_size") == 2
    assert int(td["response_mask"].sum()) == sum(len(t.response_ids) for t in transitions)


def test_static_micro_batches_get_whole_micro_batches_on_every_rank(
    recorded_run: Any, fake_actor: Any, samples: list[Any]
) -> None:
    # VeRL's prepare_micro_batches asserts rows % micro_batch_size_per_gpu == 0 on each rank
    transitions = _transitions(samples)[:5]
    config = VerlBackendConfig(pad_token_id=recorded_run.pad_token_id, micro_batch_size=4)
    metrics = VerlBackend(VerlWorkers(actor=fake_actor(), dp_size=2), config).update(transitions)
    assert metrics["train/verl/rows"] == 8 and metrics["train/verl/pad_rows"] == 3
    with pytest.raises(ValueError, match="micro_batch_size"):
        VerlBackendConfig(micro_batch_size=0)


def test_recompute_mode_asks_the_actor_for_old_logprobs(recorded_run: Any, fake_actor: Any, samples: list[Any]) -> None:
    transitions = [copy.copy(t) for t in _transitions(samples)[:4]]
    for t in transitions:
        t.response_logprobs = None
    fake = fake_actor()
    config = VerlBackendConfig(pad_token_id=recorded_run.pad_token_id, old_logprobs="recompute")
    backend = VerlBackend(VerlWorkers(actor=fake, dp_size=1), config)
    backend.update(transitions)
    assert len(fake.received) == 2  # compute_log_prob, then update_actor
    # ratio is exactly 1 -> the loss is -token-mean(advantage)
    n = sum(len(t.response_ids) for t in transitions)
    expected = -sum(t.advantage * len(t.response_ids) for t in transitions) / n
    assert fake.losses[0] == pytest.approx(expected, abs=1e-5)


def test_checkpoints_go_through_the_actor_and_restore_step_and_version(
    recorded_run: Any, fake_actor: Any, tmp_path: Path
) -> None:
    fake = fake_actor()
    backend = VerlBackend(VerlWorkers(actor=fake, dp_size=1), version=5)
    backend.step = 7
    path = backend.save_checkpoint(tmp_path / "step_7")
    assert path.exists() and fake.saved == [str(tmp_path / "step_7" / "actor")]
    other = VerlBackend(VerlWorkers(actor=fake, dp_size=1))
    other.load_checkpoint(tmp_path / "step_7")
    assert (other.step, other.version) == (7, 5) and fake.loaded == [str(tmp_path / "step_7" / "actor")]
    with pytest.raises(FileNotFoundError, match="no VeRL checkpoint"):
        other.load_checkpoint(tmp_path / "missing")


def test_torch_backend_config_defaults_are_the_same_algorithm() -> None:
    """Both backends default to PPO-clip 0.2, sampled old logprobs, one epoch, one mini-batch."""
    t, v = TorchBackendConfig(), VerlBackendConfig()
    assert (t.old_logprobs, t.ppo_epochs, t.mini_batches) == (v.old_logprobs, v.ppo_epochs, v.mini_batches)
