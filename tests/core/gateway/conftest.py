"""Fixtures for the gateway tests: the real tiny engine, a store with claimed attempts, a running gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from fastapi import FastAPI

from lightning_rl.agent import rollout_base_url
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.engine.tiny import default_tiny_model
from lightning_rl.gateway import GatewayConfig, create_gateway_app, running_gateway
from lightning_rl.store import LightningStore, MemoryStore
from lightning_rl.types import Claim, RolloutRequest, Task

LIMITS = GatewayConfig(max_n=4, max_tokens_limit=64)


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    return default_tiny_model()


@pytest.fixture(scope="session")
def engine(tiny_model_path: Path) -> Iterator[TransformersEngine]:
    """One engine for the session (never swapped: weight-swap tests build their own)."""
    eng = TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=16)
    yield eng
    eng.close()


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore()
    yield s
    await s.close()


async def claim_attempts(store: LightningStore, k: int) -> list[Claim]:
    """Enqueue and claim ``k`` rollouts: the attempts the gateway's spans must belong to."""
    await store.enqueue([RolloutRequest(task=Task(input=i)) for i in range(k)])
    claims = await store.claim("test-worker", n=k)
    assert len(claims) == k
    return claims


def rollout_url(base: str, claim: Claim) -> str:
    """The attempt's base URL, as the runner hands it to the agent (with the attempt's key)."""
    return rollout_base_url(base, claim.rollout.id, claim.attempt.id, claim.attempt.gateway_key)


@dataclass
class Gateway:
    url: str
    app: FastAPI
    store: LightningStore
    clients: list[openai.AsyncOpenAI] = field(default_factory=list[openai.AsyncOpenAI])

    def client(self, base_url: str | None = None, **kwargs: object) -> openai.AsyncOpenAI:
        """An async OpenAI client (closed with the fixture)."""
        c = openai.AsyncOpenAI(base_url=base_url or self.v1, api_key="unused", **kwargs)  # type: ignore[arg-type]
        self.clients.append(c)
        return c

    async def aclose(self) -> None:
        for c in self.clients:
            await c.close()

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    async def flush(self) -> None:
        assert await self.app.state.gateway.writer.flush(10.0)


@pytest.fixture
async def gateway(engine: TransformersEngine, store: MemoryStore) -> AsyncIterator[Gateway]:
    app = create_gateway_app(engine, store=store, config=LIMITS)
    async with running_gateway(app) as url:
        gw = Gateway(url, app, store)
        yield gw
        await gw.aclose()
