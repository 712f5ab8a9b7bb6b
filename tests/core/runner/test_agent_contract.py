"""The agent contract: the ``LLM`` an agent receives and how ``--agent module:function`` resolves."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.agent import LLM, is_async_agent, load_agent, rollout_base_url
from lightning_rl.types import LLMResource

RESOURCE = LLMResource(base_url="http://127.0.0.1:4748/", model="tiny", api_key="k", sampling={"temperature": 0.5})


def test_llm_points_at_the_attempts_own_gateway_url() -> None:
    llm = LLM.for_attempt(RESOURCE, "ro-1", "at-2", resources_version=3)
    assert llm.base_url == "http://127.0.0.1:4748/rollouts/ro-1/attempts/at-2/v1"
    assert (llm.model, llm.api_key, dict(llm.sampling), llm.resources_version) == ("tiny", "k", {"temperature": 0.5}, 3)
    # a resource published with /v1 routes the same way
    assert rollout_base_url("http://h:1/v1", "r", "a") == "http://h:1/rollouts/r/attempts/a/v1"


def test_llm_is_frozen_and_its_sampling_cannot_leak_between_rollouts() -> None:
    sampling = {"temperature": 0.5}
    llm = LLM(base_url="http://h/v1", model="m", sampling=sampling)
    sampling["temperature"] = 2.0
    assert llm.sampling["temperature"] == 0.5
    with pytest.raises(TypeError):
        llm.sampling["temperature"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        llm.model = "other"  # type: ignore[misc]


def test_for_role_gives_a_role_specific_url() -> None:
    llm = LLM.for_attempt(RESOURCE, "ro-1", "at-2")
    planner = llm.for_role("planner")
    assert planner.base_url == "http://127.0.0.1:4748/rollouts/ro-1/attempts/at-2/roles/planner/v1"
    assert planner.role == "planner" and llm.role is None
    coder = planner.for_role("code writer")  # replaces, never nests roles
    assert coder.base_url == "http://127.0.0.1:4748/rollouts/ro-1/attempts/at-2/roles/code%20writer/v1"
    with pytest.raises(ValueError, match="non-empty"):
        llm.for_role("")


async def test_openai_clients_use_the_gateway_url() -> None:
    llm = LLM.for_attempt(RESOURCE, "ro-1", "at-2")
    client = llm.openai_client(max_retries=0)
    aclient = llm.async_openai_client()
    try:
        assert str(client.base_url) == llm.base_url + "/" and client.api_key == "k" and client.max_retries == 0
        assert str(aclient.base_url) == llm.base_url + "/"
    finally:
        client.close()
        await aclient.close()


def test_is_async_agent_sees_through_partials_and_callables() -> None:
    async def a(task: Any, llm: LLM, extra: int = 0) -> float:
        return 0.0

    def s(task: Any, llm: LLM) -> float:
        return 0.0

    class AsyncAgent:
        async def __call__(self, task: Any, llm: LLM) -> float:
            return 0.0

    assert is_async_agent(a) and is_async_agent(functools.partial(a, extra=1)) and is_async_agent(AsyncAgent())
    assert not is_async_agent(s) and not is_async_agent(functools.partial(s))


def test_load_agent_resolves_module_and_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    import runner_agents

    assert load_agent("runner_agents:quick") is runner_agents.quick
    assert load_agent("lightning_rl.agent:LLM.for_attempt") == LLM.for_attempt
    with pytest.raises(ValueError, match="package.module:function"):
        load_agent("runner_agents")
    with pytest.raises(ValueError, match="not a callable"):
        load_agent("runner_agents:__doc__")
    with pytest.raises(ImportError, match="PYTHONPATH"):
        load_agent("surely_not_a_module_abc:agent")
