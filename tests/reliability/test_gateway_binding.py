"""A gateway call is bound to a claimed, running attempt and must carry that attempt's key.

Issue 26.2/26.3: ``POST /rollouts/B/v1/chat/completions`` (or ``X-Lightning-Rollout: B``) wrote
into rollout B knowing only its id, also after B finished; calls for unknown rollouts were served
and their record dropped; the agents' key also opened ``/admin/weights``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from lightning_rl.agent import LLM, rollout_base_url
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.tiny import default_tiny_model
from lightning_rl.gateway import GatewayConfig
from lightning_rl.store import MemoryStore
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import AttemptStatus, Claim, LLMResource, RolloutRequest, Task

from .gateway_helpers import GOOD_CHAT, assert_openai_error, serving

CONFIG = GatewayConfig(max_n=4, max_tokens_limit=64, attempt_check_s=0.0)


@pytest.fixture(scope="module")
def engine() -> Iterator[TransformersEngine]:
    eng = TransformersEngine.from_pretrained(default_tiny_model(), max_batch_size=8)
    yield eng
    eng.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.sqlite")
    yield s
    await s.close()


async def _claims(store: MemoryStore | SQLiteStore, k: int) -> list[Claim]:
    await store.enqueue([RolloutRequest(task=Task(input=i)) for i in range(k)])
    return await store.claim("w", n=k)


def _url(root: str, claim: Claim) -> str:
    return rollout_base_url(root, claim.rollout.id, claim.attempt.id, claim.attempt.gateway_key)


async def _spans(store: MemoryStore | SQLiteStore, claim: Claim) -> int:
    return len(await store.query_spans(rollout_id=claim.rollout.id))


async def test_the_key_is_minted_at_claim_and_kept_by_the_store(store: SQLiteStore) -> None:
    a, b = await _claims(store, 2)
    assert a.attempt.gateway_key and b.attempt.gateway_key and a.attempt.gateway_key != b.attempt.gateway_key
    assert len(a.attempt.gateway_key) >= 24
    assert (await store.get_attempt(a.attempt.id)).gateway_key == a.attempt.gateway_key
    assert a.attempt.gateway_key not in repr(a.attempt)  # not in logs that print the attempt
    llm = LLM.for_attempt(LLMResource(base_url="http://gw:1", model="m"), a.rollout.id, a.attempt.id, key="K1")
    assert llm.base_url == f"http://gw:1/rollouts/{a.rollout.id}/attempts/{a.attempt.id}/key/K1/v1"
    assert llm.for_role("planner").base_url == llm.base_url.removesuffix("/v1") + "/roles/planner/v1"


async def test_own_key_is_recorded_and_another_rollouts_id_is_not_enough(
    engine: TransformersEngine, store: SQLiteStore
) -> None:
    a, b = await _claims(store, 2)
    async with serving(engine, store, config=CONFIG) as root, httpx.AsyncClient(timeout=60) as http:
        assert (await http.post(f"{_url(root, a)}/chat/completions", json=GOOD_CHAT)).status_code == 200
        # B's ids, without B's key: by URL, by rollout-only URL, by headers, and with A's key
        attempts: list[tuple[str, dict[str, str]]] = [
            (f"{root}/rollouts/{b.rollout.id}/attempts/{b.attempt.id}/v1", {}),
            (f"{root}/rollouts/{b.rollout.id}/v1", {}),
            (f"{root}/v1", {"X-Lightning-Rollout": b.rollout.id}),
            (f"{root}/v1", {"X-Lightning-Rollout": b.rollout.id, "X-Lightning-Attempt": b.attempt.id}),
            (rollout_base_url(root, b.rollout.id, b.attempt.id, a.attempt.gateway_key), {}),
            (f"{root}/v1", {"X-Lightning-Rollout": b.rollout.id, "X-Lightning-Key": str(a.attempt.gateway_key)}),
        ]
        for base, headers in attempts:
            r = await http.post(f"{base}/chat/completions", json=GOOD_CHAT, headers=headers)
            error = assert_openai_error(r, 403)
            assert error["code"] == "attempt_key_mismatch" and error["type"] == "permission_error"
        # streamed, completions and responses are bound the same way
        bad = f"{root}/rollouts/{b.rollout.id}/v1"
        assert (await http.post(f"{bad}/chat/completions", json={**GOOD_CHAT, "stream": True})).status_code == 403
        assert (await http.post(f"{bad}/completions", json={"prompt": "hi", "max_tokens": 2})).status_code == 403
        assert (await http.post(f"{bad}/responses", json={"input": "hi", "max_output_tokens": 2})).status_code == 403
        # B's own key by header works too
        r = await http.post(
            f"{root}/v1/chat/completions",
            json=GOOD_CHAT,
            headers={"X-Lightning-Rollout": b.rollout.id, "X-Lightning-Key": str(b.attempt.gateway_key)},
        )
        assert r.status_code == 200
    assert await _spans(store, a) == 1 and await _spans(store, b) == 1


async def test_unknown_rollout_or_attempt_is_404_and_nothing_is_served(
    engine: TransformersEngine, store: SQLiteStore
) -> None:
    [a] = await _claims(store, 1)
    before = engine.stats().requests
    async with serving(engine, store, config=CONFIG) as root, httpx.AsyncClient(timeout=60) as http:
        for base in (
            f"{root}/rollouts/ro-typo/v1",
            rollout_base_url(root, a.rollout.id, "at-typo", a.attempt.gateway_key),
            rollout_base_url(root, "ro-typo", a.attempt.id, a.attempt.gateway_key),  # attempt of another rollout
        ):
            error = assert_openai_error(await http.post(f"{base}/chat/completions", json=GOOD_CHAT), 404)
            assert error["code"] == "attempt_not_found"
        r = await http.post(f"{root}/v1/chat/completions", json=GOOD_CHAT, headers={"X-Lightning-Rollout": "ro-x"})
        assert_openai_error(r, 404)
    assert engine.stats().requests == before  # refused before any generation
    assert await _spans(store, a) == 0


async def test_ended_attempt_is_409_and_not_recorded(engine: TransformersEngine, store: SQLiteStore) -> None:
    [a] = await _claims(store, 1)
    async with serving(engine, store, config=CONFIG) as root, httpx.AsyncClient(timeout=60) as http:
        url = f"{_url(root, a)}/chat/completions"
        assert (await http.post(url, json=GOOD_CHAT)).status_code == 200
        await store.finish_attempt(a.attempt.id, AttemptStatus.SUCCEEDED, reward=1.0)
        headers = {"X-Lightning-Key": str(a.attempt.gateway_key)}
        for target in (url, f"{root}/rollouts/{a.rollout.id}/v1/chat/completions"):
            error = assert_openai_error(await http.post(target, json=GOOD_CHAT, headers=headers), 409)
            assert error["code"] == "attempt_not_running" and "succeeded" in error["message"]
    assert await _spans(store, a) == 1


async def test_cached_answers_are_rechecked_after_the_ttl(engine: TransformersEngine) -> None:
    """With the default TTL a running attempt is looked up once per ``attempt_check_s``, not per call."""
    store = MemoryStore()
    [a] = await _claims(store, 1)
    calls = {"n": 0}
    original = store.get_attempt

    async def counting(attempt_id: str) -> Any:
        calls["n"] += 1
        return await original(attempt_id)

    store.get_attempt = counting  # type: ignore[method-assign]
    config = dataclasses.replace(CONFIG, attempt_check_s=60.0)
    async with serving(engine, store, config=config) as root, httpx.AsyncClient(timeout=60) as http:
        for _ in range(5):
            assert (await http.post(f"{_url(root, a)}/chat/completions", json=GOOD_CHAT)).status_code == 200
    assert calls["n"] == 1
    await store.close()


async def test_admin_token_is_separate_from_the_agents_key(engine: TransformersEngine, tmp_path: Path) -> None:
    weights = tmp_path / "w"
    weights.mkdir()
    torch.save({k: v.clone() for k, v in engine.model.state_dict().items()}, weights / "v1.pt")
    config = dataclasses.replace(CONFIG, weights_dir=str(weights))
    with pytest.raises(ValueError, match="differ"):
        async with serving(engine, config=config, token="same", admin_token="same"):
            pass
    async with serving(engine, config=config, token="agents", admin_token="operator") as root:
        async with httpx.AsyncClient(timeout=60) as http:
            body = {"path": "v1.pt", "version": 1}
            for key in ("agents", "wrong", None):
                headers = {"authorization": f"Bearer {key}"} if key else {}
                r = await http.post(f"{root}/admin/weights", json=body, headers=headers)
                assert_openai_error(r, 401)
            r = await http.post(f"{root}/admin/weights", json=body, headers={"authorization": "bearer operator"})
            assert r.status_code == 200 and r.json() == {"version": 1}
            # the admin token is no model key
            r = await http.post(
                f"{root}/v1/chat/completions", json=GOOD_CHAT, headers={"authorization": "Bearer operator"}
            )
            assert_openai_error(r, 401)
    async with serving(engine, config=config) as root, httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{root}/admin/weights", json={"path": "v1.pt", "version": 2})
        assert assert_openai_error(r, 403)["code"] == "admin_disabled"
