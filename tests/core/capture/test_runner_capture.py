"""``lightning-rl runner --capture FAMILY``: a worker process whose agent calls a hosted endpoint.

The agent knows nothing of Lightning; the flag alone makes its model calls land in the store as
spans of the standard instrumentation, and the adapter builds the transitions SFT, APO and the
dashboard read (the text) from the store file, in this process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.adapter import adapt_attempt
from lightning_rl.dashboard._settings import CreditSettings
from lightning_rl.dashboard.views import rollout_detail
from lightning_rl.gateway import running_gateway
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.testing import FakeReply, FakeToolCall, FakeUpstream
from lightning_rl.types import LLMResource, RolloutRequest, RolloutStatus, Task

from .conftest import FAMILIES, Family

AGENTS = Path(__file__).parent  # holds capture_agents.py


def reply_for(body: dict[str, Any]) -> FakeReply | str:
    last = body["messages"][-1]
    if last["role"] == "tool":
        return f"it is {last['content']}"
    a, b = (int(x) for x in str(last["content"]).rstrip("?").split("+"))
    return FakeReply(tool_calls=[FakeToolCall("add", {"a": a, "b": b})])


@pytest.fixture
async def hosted() -> AsyncIterator[tuple[FakeUpstream, str]]:
    upstream = FakeUpstream(responder=reply_for)
    async with running_gateway(upstream.app) as url:
        yield upstream, f"{url}/v1"


@pytest.mark.parametrize("family", FAMILIES)
async def test_runner_capture_flag_records_a_hosted_agents_calls(
    family: Family, hosted: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    upstream, url = hosted
    db = tmp_path / "store.db"
    store = SQLiteStore(db)
    try:
        await store.add_resources(llm=LLMResource(base_url="http://127.0.0.1:9", model="unused"))
        tasks = [Task(input={"url": url, "a": i, "b": 10}) for i in range(3)]
        ids = [r.id for r in await store.enqueue([RolloutRequest(task=t) for t in tasks])]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AGENTS), env.get("PYTHONPATH")) if p)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lightning_rl.cli",
            "runner",
            "--store",
            str(db),
            "--agent",
            "capture_agents:hosted_adder",
            "--capture",
            family,
            "--until-idle",
            "--poll-interval",
            "0.1",
            "--log-level",
            "WARNING",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 240)
        assert proc.returncode == 0, err.decode()[-3000:]
        assert len(upstream.requests) == 6  # the agent called the hosted endpoint, twice per rollout
        for rollout in await store.query_rollouts(ids=ids):
            assert rollout.status is RolloutStatus.SUCCEEDED and rollout.final_reward == 1.0
            [attempt] = await store.query_attempts(rollout.id)
            spans = await store.query_spans(attempt_id=attempt.id)
            adapted = adapt_attempt(rollout, attempt.id, spans, trainable="all")
            first, second = adapted.transitions
            a = rollout.task.input["a"]
            assert first.text and first.text.source == family and first.text.tool_calls[0]["name"] == "add"
            assert first.text.messages == [{"role": "user", "content": f"{a}+10?"}]
            assert second.text and second.text.response == f"it is {a + 10}"
            assert second.text.messages[-1] == {
                "role": "tool",
                "content": str(a + 10),
                "tool_call_id": first.text.tool_calls[0]["id"],
            }
            assert not first.exact_tokens and first.response_ids == []
            # the dashboard's rollout page lists the captured calls and their transitions
            detail = await rollout_detail(store, rollout.id, CreditSettings())
            calls = detail["attempts"][-1]["calls"]
            assert [c["exact_tokens"] for c in calls] == [False, False]
            assert calls[1]["response_text"] == f"it is {a + 10}" and calls[0]["tool_calls"][0]["name"] == "add"
            assert [c["span_id"] for c in calls] == [t.span_id for t in adapted.transitions]
            rows = detail["credit"]["rows"]
            assert [r["exact_tokens"] for r in rows] == [False, False] and detail["credit"]["final_reward"] == 1.0
    finally:
        await store.close()
