"""``FrozenRolesBackend``: frozen roles answered by weights that weight swaps never reach.

Two real tiny engines behind one real gateway: the policy's weights are swapped (``/admin/weights``)
while the frozen engine keeps the start; each role's calls must be served, and recorded, by its side.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import torch

from lightning_rl import semconv as sc
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.gateway import EngineBackend, FrozenRolesBackend, create_gateway_app, running_gateway
from lightning_rl.store import MemoryStore

from .conftest import LIMITS, claim_attempts, rollout_url

PROMPTS = ["hello", "what is two plus two", "the cat sat on"]


def _role_url(base: str, role: str) -> str:
    return f"{base.removesuffix('/v1')}/roles/{role}/v1"


async def test_frozen_roles_keep_the_starting_weights_while_the_policy_changes(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    policy = TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8)
    frozen = TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8)
    reference = TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8)  # never changed either
    asked: list[str | None] = []

    def is_frozen(role: str | None) -> bool:
        asked.append(role)
        return role == "critic"

    routed = FrozenRolesBackend(EngineBackend(policy), EngineBackend(frozen), is_frozen)
    store = MemoryStore()
    [claim] = await claim_attempts(store, 1)
    app = create_gateway_app(
        routed, store=store, config=dataclasses.replace(LIMITS, weights_dir=str(tmp_path)), admin_token="adm1n"
    )
    weights = tmp_path / "v1.pt"
    torch.save({k: v * 0.5 for k, v in policy.model.state_dict().items()}, weights)
    try:
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=120) as http:
            base = rollout_url(url, claim)

            async def ask(role: str, prompt: str, stream: bool = False) -> None:
                body = {
                    "model": policy.model_name,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 6,
                    "temperature": 0,
                }
                if stream:
                    body["stream"] = True
                r = await http.post(f"{_role_url(base, role)}/chat/completions", json=body)
                assert r.status_code == 200, r.text

            swapped = await http.post(
                f"{url}/admin/weights",
                json={"path": str(weights), "version": 1},
                headers={"authorization": "Bearer adm1n"},
            )
            assert swapped.status_code == 200 and swapped.json() == {"version": 1}
            assert policy.version == 1 and frozen.version == 0  # the load reached the policy only
            for prompt in PROMPTS:
                await ask("writer", prompt)
                await ask("critic", prompt)
            await ask("critic", PROMPTS[0], stream=True)
            assert await app.state.gateway.writer.flush(10.0)
        spans = await store.query_spans(rollout_id=claim.rollout.id)
        calls = [s for s in spans if s.name == sc.SPAN_LLM_CALL]
        by_role: dict[str, list[int]] = {}
        for s in calls:
            by_role.setdefault(str(s.attributes[sc.ROLE]), []).append(int(s.attributes[sc.MODEL_VERSION]))
        assert by_role == {"writer": [1, 1, 1], "critic": [0, 0, 0, 0]}
        assert routed.frozen_calls == 4 and asked.count("critic") == 4 and asked.count("writer") == 3
        # the critic's greedy answers are exactly what the untouched starting weights give
        critic = [s for s in calls if s.attributes[sc.ROLE] == "critic"][: len(PROMPTS)]
        for prompt, span in zip(PROMPTS, critic, strict=True):
            ids = reference.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            assert list(span.attributes[sc.PROMPT_TOKEN_IDS]) == list(ids)
            out = reference.model.generate(
                torch.tensor([ids]), max_new_tokens=6, do_sample=False, pad_token_id=reference.tokenizer.pad_token_id
            )
            expected = out[0, len(ids) :].tolist()
            got = list(span.attributes[sc.RESPONSE_TOKEN_IDS])
            assert got == expected[: len(got)] and len(got) >= 1
    finally:
        policy.close()
        frozen.close()
        reference.close()
        await store.close()


async def test_the_routed_backend_names_the_policy_and_bounds_bodies_by_both_sides(engine: TransformersEngine) -> None:
    routed = FrozenRolesBackend(EngineBackend(engine), EngineBackend(engine), lambda role: False)
    assert routed.model_name == engine.model_name and routed.version == engine.version
    bound = EngineBackend(engine).body_bound()
    assert routed.body_bound() == bound
