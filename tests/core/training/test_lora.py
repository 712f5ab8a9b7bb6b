"""LoRA on the torch backend: only adapters train, and the engine receives merged full weights."""

from __future__ import annotations

from pathlib import Path

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
