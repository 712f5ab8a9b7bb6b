"""Publishing weights to a gateway that runs its own engine, through the authenticated admin endpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from lightning_rl.backends.publish import gateway_publisher
from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
from lightning_rl.engine.base import SamplingParams
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.gateway import GatewayConfig, create_gateway_app, running_gateway
from lightning_rl.types import Transition


async def test_publish_through_the_gateway_admin_endpoint(tiny_model_path: Path, tmp_path: Path) -> None:
    with TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=4) as engine:
        config = GatewayConfig(weights_dir=str(tmp_path / "weights"))
        app = create_gateway_app(engine, token="agents-key", admin_token="s3cret", config=config)
        async with running_gateway(app) as url:
            policy = TorchBackend(
                AutoModelForCausalLM.from_pretrained(tiny_model_path),
                TorchBackendConfig(old_logprobs="recompute", lr=1e-2),
                publisher=gateway_publisher(url, tmp_path / "weights", token="s3cret"),
                version=engine.version,
            )
            prompt = engine.encode_chat([{"role": "user", "content": "hi"}], None)
            batch = [
                Transition(prompt_ids=prompt, response_ids=[5, 6, 7], rollout_id="r", attempt_id="a", advantage=1.0)
            ]
            policy.update(batch)
            version = await policy.publish()
            assert engine.version == version
            out = await engine.generate(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=1))
            t = Transition(prompt_ids=prompt, response_ids=out.token_ids, rollout_id="r", attempt_id="a")
            assert policy.logprobs([t])[0] == pytest.approx(out.logprobs, abs=1e-4)
            assert [p.name for p in (tmp_path / "weights").iterdir()] == [f"weights-v{version}.pt"]

            wrong = gateway_publisher(url, tmp_path / "w2", token="nope")
            with pytest.raises(PermissionError, match="refused the weights"):
                await wrong(policy.state_dict_for_inference(), version + 1)
            agents_key = gateway_publisher(url, tmp_path / "weights", token="agents-key")
            with pytest.raises(PermissionError, match="admin token"):
                await agents_key(policy.state_dict_for_inference(), version + 1)
            outside = gateway_publisher(url, tmp_path / "w2", token="s3cret")  # not the gateway's weights folder
            with pytest.raises(PermissionError, match="outside"):
                await outside(policy.state_dict_for_inference(), version + 1)
            assert engine.version == version
