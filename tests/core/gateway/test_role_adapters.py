"""``RoleAdaptersBackend``: each trainable role answered by its own LoRA adapter in one engine, the
others by the base; every call's span records which adapter, and which version of it, answered it.

A real tiny engine with per-row adapters behind one real gateway, called over HTTP on role URLs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from lightning_rl import semconv as sc
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.lora import AdapterWeights
from lightning_rl.gateway import EngineBackend, RoleAdaptersBackend, create_gateway_app, running_gateway
from lightning_rl.store import MemoryStore

from .conftest import LIMITS, claim_attempts, rollout_url

peft = pytest.importorskip("peft")


def _role_url(base: str, role: str) -> str:
    return f"{base.removesuffix('/v1')}/roles/{role}/v1"


def _writer_adapter(tiny_model_path: Path) -> AdapterWeights:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path), lora, adapter_name="writer")
    return AdapterWeights(peft.get_peft_model_state_dict(model, adapter_name="writer"), 2.0)


async def test_each_call_is_answered_and_recorded_by_its_roles_adapter(tiny_model_path: Path) -> None:
    engine = TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8)
    engine.enable_adapters(["q_proj", "v_proj"])
    routed = RoleAdaptersBackend(EngineBackend(engine))
    store = MemoryStore()
    [claim] = await claim_attempts(store, 1)
    app = create_gateway_app(routed, store=store, config=LIMITS)
    try:
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=120) as http:
            base = rollout_url(url, claim)

            async def ask(role: str, stream: bool = False) -> None:
                body = {
                    "model": engine.model_name,
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 4,
                    "temperature": 0,
                    "stream": stream,
                }
                r = await http.post(f"{_role_url(base, role)}/chat/completions", json=body)
                assert r.status_code == 200, r.text

            await ask("writer")  # before the writer has an adapter: the base answers it
            await engine.load_adapters({"writer": _writer_adapter(tiny_model_path)}, version=1)
            await ask("writer")
            await ask("writer", stream=True)
            await ask("checker")
            assert await app.state.gateway.writer.flush(10.0)
        spans = [s for s in await store.query_spans(rollout_id=claim.rollout.id) if s.name == sc.SPAN_LLM_CALL]
        seen = [
            (
                s.attributes[sc.ROLE],
                s.attributes.get(sc.ADAPTER),
                s.attributes.get(sc.ADAPTER_VERSION),
                s.attributes[sc.MODEL_VERSION],
            )
            for s in sorted(spans, key=lambda s: s.start_ns)
        ]
        assert seen == [
            ("writer", None, None, 0),
            ("writer", "writer", 1, 1),
            ("writer", "writer", 1, 1),
            ("checker", None, None, 0),
        ]
        assert routed.adapter_calls == 2
        base_ids, adapted_ids = (
            list(s.attributes[sc.RESPONSE_TOKEN_IDS]) for s in sorted(spans, key=lambda s: s.start_ns)[:2]
        )
        assert base_ids != adapted_ids  # the adapter did answer
    finally:
        engine.close()
        await store.close()


def test_a_role_the_selector_refuses_gets_the_base_even_with_an_adapter_of_its_name(
    engine: TransformersEngine,
) -> None:
    routed = RoleAdaptersBackend(EngineBackend(engine), is_trainable=lambda role: role == "writer")
    assert routed.adapter_for(None) is None and routed.adapter_for("checker") is None
    assert routed.adapter_for("writer") is None  # no adapter loaded (the shared engine serves none)
    assert routed.model_name == engine.model_name and routed.version == engine.version
