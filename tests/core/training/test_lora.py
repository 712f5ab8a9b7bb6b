"""LoRA on the torch backend: only adapters train, and the engine receives merged full weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
from lightning_rl.engine.base import SamplingParams
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.types import Transition

pytest.importorskip("peft")


async def test_lora_trains_adapters_and_publishes_merged_weights(tiny_model_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=4) as engine:
        policy = TorchBackend(
            AutoModelForCausalLM.from_pretrained(tiny_model_path),
            TorchBackendConfig(old_logprobs="recompute", lr=5e-2, lora_rank=4),
            publisher=engine.load_weights,
            version=engine.version,
        )
        trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
        prompt = engine.encode_chat([{"role": "user", "content": "hi"}], None)
        batch = [Transition(prompt_ids=prompt, response_ids=[5, 6, 7], rollout_id="r", attempt_id="a", advantage=1.0)]
        before = policy.logprobs(batch)[0]
        policy.update(batch)
        policy.update(batch)
        assert sum(policy.logprobs(batch)[0]) > sum(before)
        state = policy.state_dict_for_inference()
        assert set(state) == set(base) and any(not torch.equal(state[k], base[k]) for k in base)
        version = await policy.publish()
        out = await engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=2))
        assert out.model_version == version
        t = Transition(prompt_ids=prompt, response_ids=out.token_ids, rollout_id="r", attempt_id="a")
        assert policy.logprobs([t])[0] == pytest.approx(out.logprobs, abs=1e-4)


def test_lora_layers_adapts_the_top_layers_only_and_the_backward_stops_there(tiny_model_path: Path) -> None:
    depth = AutoModelForCausalLM.from_pretrained(tiny_model_path).config.num_hidden_layers
    assert depth >= 2
    policy = TorchBackend(
        AutoModelForCausalLM.from_pretrained(tiny_model_path),
        TorchBackendConfig(old_logprobs="recompute", lr=5e-2, lora_rank=4, lora_layers=1),
    )
    adapted = {n.split(".layers.")[1].split(".")[0] for n, p in policy.model.named_parameters() if p.requires_grad}
    assert adapted == {str(depth - 1)}
    batch = [Transition(prompt_ids=[3, 4, 5, 6], response_ids=[5, 6, 7], rollout_id="r", attempt_id="a", advantage=1.0)]
    before = policy.logprobs(batch)[0]
    policy.update(batch)
    assert sum(policy.logprobs(batch)[0]) > sum(before)
    listed = TorchBackend(
        AutoModelForCausalLM.from_pretrained(tiny_model_path),
        TorchBackendConfig(lora_rank=4, lora_layers=[0]),
    )
    assert {n.split(".layers.")[1].split(".")[0] for n, p in listed.model.named_parameters() if p.requires_grad} == {
        "0"
    }


@pytest.mark.parametrize("layers", [0, -1, True, [], [-1]])
def test_lora_layers_rejects_what_names_no_layer(layers: object) -> None:
    with pytest.raises(ValueError, match="lora_layers"):
        TorchBackendConfig(lora_rank=4, lora_layers=layers)  # pyright: ignore[reportArgumentType]


async def test_an_engine_that_borrows_the_lora_base_serves_the_policy_and_never_writes_the_base(
    tiny_model_path: Path,
) -> None:
    with TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=4) as engine:
        policy = TorchBackend(
            AutoModelForCausalLM.from_pretrained(tiny_model_path),
            TorchBackendConfig(old_logprobs="recompute", lr=5e-2, lora_rank=4, lora_layers=1),
            publisher=engine.load_weights,
            version=engine.version,
        )
        base: Any = policy.model.get_base_model()  # pyright: ignore[reportAttributeAccessIssue]
        frozen = {k: v.clone() for k, v in base.state_dict().items() if "lora_" not in k}
        saved = engine.borrow_weights(base)
        assert saved == sum(p.numel() * p.element_size() for p in base.parameters() if not p.requires_grad)
        prompt = engine.encode_chat([{"role": "user", "content": "hi"}], None)
        batch = [Transition(prompt_ids=prompt, response_ids=[5, 6, 7], rollout_id="r", attempt_id="a", advantage=1.0)]
        for _ in range(2):
            policy.update(batch)
            await policy.publish()
        # the trainer's base is bit-identical; the engine serves base + adapters, as the policy computes them
        after = base.state_dict()
        assert all(torch.equal(after[k], v) for k, v in frozen.items())
        out = await engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=2))
        t = Transition(prompt_ids=prompt, response_ids=out.token_ids, rollout_id="r", attempt_id="a")
        assert policy.logprobs([t])[0] == pytest.approx(out.logprobs, abs=1e-4)
        with pytest.raises(RuntimeError, match="before the engine serves"):
            engine.borrow_weights(base)
