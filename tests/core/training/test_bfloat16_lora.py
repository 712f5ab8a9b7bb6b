"""LoRA on a bfloat16 base (``TorchBackendConfig.dtype`` / ``TrainerConfig.precision``).

The base is frozen, so it needs no float32 master copy: it is stored in bfloat16 while the adapters,
their gradients and the optimizer stay float32 and the output head runs on a float32 copy. What
must hold: the adapters really are float32 and train; a publish neither rounds nor moves the base
(the merged weights are computed beside the model, not merged in place); and the backend's
recomputed logprobs stay within rounding of what a bfloat16 engine sampled, which bounds how far
the PPO ratio's two sides can drift apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig, fast_bfloat16
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.trainer.config import TrainerConfig

from .conftest import sampled_transitions

pytest.importorskip("peft")

ENGINE_GAP = 0.02
"""Largest |backend recomputed - bfloat16 engine sampled| logprob allowed. Both run the same bfloat16
base; they differ by the engine's bfloat16 head against the backend's float32 copy of it (the
adapters are still zero here). Measured on the tiny model (the 96 tokens sampled below, an Intel
Xeon with AMX, 1 torch thread): max 3.3e-3, mean 1.0e-3. 0.02 is 6x that max; a wrong position or
weight version moves logprobs by 1e-2 to whole nats."""


def _bf16_backend(path: Path, **overrides: object) -> TorchBackend:
    settings: dict[str, object] = {"lora_rank": 4, "dtype": "bfloat16", "old_logprobs": "recompute", "lr": 5e-2}
    settings.update(overrides)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    return TorchBackend(model, TorchBackendConfig(**settings))  # pyright: ignore[reportArgumentType]


def test_the_base_is_bfloat16_and_the_adapters_and_head_float32(tiny_model_path: Path) -> None:
    backend = _bf16_backend(tiny_model_path)
    trainable = {n: p for n, p in backend.model.named_parameters() if p.requires_grad}
    frozen = [p for p in backend.model.parameters() if not p.requires_grad]
    assert trainable and all("lora_" in n and p.dtype == torch.float32 for n, p in trainable.items())
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert backend._head32 is not None and backend._head32.dtype == torch.float32  # pyright: ignore[reportPrivateUsage]


def test_publishing_leaves_the_base_untouched_and_merges_in_float32(tiny_model_path: Path) -> None:
    backend = _bf16_backend(tiny_model_path)
    with TransformersEngine.from_pretrained(tiny_model_path, dtype="bfloat16", max_batch_size=8) as engine:
        batch = [t.model_copy(update={"advantage": 1.0}) for t in sampled_transitions(engine, 2)]
    backend.update(batch)  # the adapters are no longer zero
    base_before = {k: v.clone() for k, v in backend.model.get_base_model().state_dict().items() if "lora_" not in k}  # pyright: ignore[reportCallIssue, reportUnknownMemberType, reportUnknownVariableType, reportAttributeAccessIssue]
    state = backend.state_dict_for_inference()
    again = backend.state_dict_for_inference()
    base_after = backend.model.get_base_model().state_dict()  # pyright: ignore[reportCallIssue, reportUnknownMemberType, reportUnknownVariableType, reportAttributeAccessIssue]
    assert all(torch.equal(v, base_after[k]) for k, v in base_before.items())  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    assert all(torch.equal(state[k], again[k]) for k in state)
    # an adapted weight: W (bfloat16, widened) + scaling * B @ A, in float32
    name = next(k for k in state if k.endswith("q_proj.weight"))
    layer = backend.model.get_base_model().get_submodule(name.removesuffix(".weight"))  # pyright: ignore[reportCallIssue, reportUnknownMemberType, reportUnknownVariableType, reportAttributeAccessIssue]
    expected = layer.base_layer.weight.float() + layer.get_delta_weight("default").float()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    assert state[name].dtype == torch.float32
    assert torch.equal(state[name], expected)
    assert not torch.equal(state[name], layer.base_layer.weight.float())  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]


def test_recomputed_logprobs_stay_within_rounding_of_a_bfloat16_engine(tiny_model_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_model_path, dtype="bfloat16", max_batch_size=8) as engine:
        transitions = sampled_transitions(engine)
    backend = _bf16_backend(tiny_model_path)
    recomputed = backend.logprobs(transitions)
    gaps = torch.cat(
        [
            torch.tensor(r) - torch.tensor(t.response_logprobs or [])
            for r, t in zip(recomputed, transitions, strict=True)
        ]
    ).abs()
    assert float(gaps.max()) < ENGINE_GAP
    assert float(gaps.mean()) < ENGINE_GAP / 5


def test_an_update_on_a_bfloat16_base_moves_logprobs_with_the_advantage(tiny_model_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_model_path, dtype="bfloat16", max_batch_size=8) as engine:
        transitions = sampled_transitions(engine, 4)
    backend = _bf16_backend(tiny_model_path)
    scored = [t.model_copy(update={"advantage": 1.0 if i % 2 else -1.0}) for i, t in enumerate(transitions)]
    before = backend.logprobs(scored)
    backend.update(scored)
    after = backend.logprobs(scored)
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        assert (sum(a) > sum(b)) == (i % 2 == 1), (b, a)


def test_a_second_optimizer_on_an_adapted_bfloat16_model_keeps_float32_adapters(tiny_model_path: Path) -> None:
    first = _bf16_backend(tiny_model_path)
    second = TorchBackend(first.model, TorchBackendConfig(dtype="bfloat16", lr=1e-3))  # the warm start's habit phase
    assert all(p.dtype == torch.float32 for p in second.model.parameters() if p.requires_grad)


def test_precision_sets_the_engine_and_backend() -> None:
    lora = TrainerConfig(precision="bfloat16", backend=TorchBackendConfig(lora_rank=8))
    assert (lora.backend.dtype, lora.backend.autocast, lora.backend.old_logprobs) == ("bfloat16", None, "recompute")
    full = TrainerConfig(precision="bfloat16")
    assert (full.backend.dtype, full.backend.autocast, full.backend.old_logprobs) == (
        "float32",
        "bfloat16",
        "recompute",
    )
    assert TrainerConfig().backend.old_logprobs == "sampled"  # float32 leaves the backend alone
    assert TrainerConfig(precision="auto").precision == ("bfloat16" if fast_bfloat16() else "float32")
    with pytest.raises(ValueError, match="precision"):
        TrainerConfig(precision="int8")
    with pytest.raises(ValueError, match="dtype"):
        TorchBackendConfig(dtype="float64")


def test_recompute_in_the_update_pass_equals_a_separate_recompute(tiny_model_path: Path) -> None:
    """With one optimizer step per update the old logprobs come from the update's own forward pass;
    the step must be the one taken against logprobs recomputed beforehand."""
    with TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8) as engine:
        transitions = sampled_transitions(engine, 4)
    scored = [t.model_copy(update={"advantage": 1.0 if i % 2 else -0.5}) for i, t in enumerate(transitions)]
    config = {"lr": 1e-2, "track_kl": False, "micro_batch_tokens": 64}  # several micro-batches
    in_pass = TorchBackend(
        AutoModelForCausalLM.from_pretrained(tiny_model_path), TorchBackendConfig(old_logprobs="recompute", **config)
    )  # pyright: ignore[reportArgumentType]
    separate = TorchBackend(
        AutoModelForCausalLM.from_pretrained(tiny_model_path), TorchBackendConfig(old_logprobs="sampled", **config)
    )  # pyright: ignore[reportArgumentType]
    recomputed = separate.logprobs(scored)
    given = [t.model_copy(update={"response_logprobs": lp}) for t, lp in zip(scored, recomputed, strict=True)]
    a, b = in_pass.update(scored), separate.update(given)
    assert a["train/ratio"] == pytest.approx(1.0) and b["train/ratio"] == pytest.approx(1.0, abs=1e-5)
    for (name, p), q in zip(in_pass.model.named_parameters(), separate.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name
