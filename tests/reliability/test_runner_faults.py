"""Issue 26, runner side: a blocking async agent, Ctrl-C twice, secrets in agent errors.

The in-process tests run the real ``Runner`` on a real SQLite store in the test's event loop, which
is the main thread (as in ``lightning-rl runner``), so the watchdog can interrupt a blocked agent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lightning_rl.runner import Runner
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import LLMResource, RolloutRequest, RolloutStatus, Task

AGENTS = Path(__file__).parent  # holds reliability_agents.py
sys.path.insert(0, str(AGENTS))
import reliability_agents as agents  # noqa: E402


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.db")
    await s.add_resources(llm=LLMResource(base_url="http://127.0.0.1:9", model="tiny"))
    yield s
    await s.close()


async def test_a_blocking_async_agent_is_interrupted_and_the_other_rollouts_go_on(store: SQLiteStore) -> None:
    tasks = [{"block": True, "seconds": 60}] + [{"seconds": 0.3} for _ in range(3)]
    await store.enqueue([RolloutRequest(id=f"r{i}", task=Task(input=t)) for i, t in enumerate(tasks)])
    started = time.monotonic()
    runner = Runner(store, agents.blocking_sometimes, concurrency=4, poll_interval_s=0.05, block_timeout_s=0.5)
    stats = await asyncio.wait_for(runner.run(until_idle=True), 30)
    assert time.monotonic() - started < 20  # not the 60 s the agent asked to sleep
    rollouts = {r.id: r for r in await store.query_rollouts()}
    assert [rollouts[f"r{i}"].status for i in range(1, 4)] == [RolloutStatus.SUCCEEDED] * 3
    blocked = rollouts["r0"]
    assert blocked.status is RolloutStatus.FAILED and blocked.error is not None
    assert "AgentBlockedError" in blocked.error and "blocking_sometimes" in blocked.error
    assert "reliability_agents.py" in blocked.error and "asyncio.sleep" in blocked.error  # where, and the fix
    assert (stats.succeeded, stats.failed) == (3, 1)


async def test_without_the_watchdog_nothing_is_interrupted(store: SQLiteStore) -> None:
    await store.enqueue([RolloutRequest(id="r0", task=Task(input={"block": True, "seconds": 0.8}))])
    runner = Runner(store, agents.blocking_sometimes, poll_interval_s=0.05, block_timeout_s=None)
    stats = await runner.run(until_idle=True)
    assert stats.succeeded == 1  # it blocked for 0.8 s and then returned: the switch is honoured


@pytest.mark.parametrize("redact_errors", [True, False])
async def test_agent_errors_are_redacted_on_request(store: SQLiteStore, redact_errors: bool) -> None:
    await store.enqueue([RolloutRequest(id="r0", task=Task(input=0))])
    await Runner(store, agents.leaks_a_key, poll_interval_s=0.05, redact_errors=redact_errors).run(until_idle=True)
    error = (await store.get_rollout("r0")).error
    assert error is not None and "RuntimeError" in error
    secrets = ("sk-proj-abcdefghijklmnopqrstuvwx", "AKIAABCDEFGHIJKLMNOP", "hunter2secret")
    if redact_errors:
        assert "[REDACTED]" in error and not any(s in error for s in secrets)
        assert "api.example.com" in error  # the rest of the message is still there
    else:
        assert all(s in error for s in secrets)


def _runner_process(db: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AGENTS), os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "lightning_rl.cli", "runner", "--store", str(db), "--poll-interval", "0.1", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _wait_for(path: Path, proc: subprocess.Popen[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _, err = proc.communicate(timeout=10)
            raise AssertionError(f"the runner never started the rollout: {err}")
        await asyncio.sleep(0.05)


async def test_a_second_sigint_exits_at_once_even_while_an_agent_blocks_the_loop(
    store: SQLiteStore, tmp_path: Path
) -> None:
    marker = tmp_path / "running"
    await store.enqueue([RolloutRequest(id="r0", task=Task(input={"block": True, "marker": str(marker)}))])
    # --block-timeout 0: no watchdog, so the loop stays blocked in time.sleep(600)
    proc = _runner_process(
        tmp_path / "store.db", "--agent", "reliability_agents:blocking_sometimes", "--block-timeout", "0"
    )
    try:
        await _wait_for(marker, proc, 60)
        await asyncio.sleep(0.3)  # the agent is inside time.sleep now
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        assert proc.poll() is None  # the first one only stops claiming (the agent would be waited for)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=15)
        assert time.monotonic() - sent < 10
        assert proc.returncode == 130, err
        assert "second SIGINT" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_one_signal_drains_the_running_rollouts_and_exits_0(
    store: SQLiteStore, tmp_path: Path, sig: signal.Signals
) -> None:
    marker = tmp_path / "running"
    await store.enqueue([RolloutRequest(id="r0", task=Task(input={"seconds": 1.0, "marker": str(marker)}))])
    proc = _runner_process(tmp_path / "store.db", "--agent", "reliability_agents:blocking_sometimes")
    try:
        await _wait_for(marker, proc, 60)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    rollout = await store.get_rollout("r0")
    assert rollout.status is RolloutStatus.SUCCEEDED  # drained, not abandoned
