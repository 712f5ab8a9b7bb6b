"""``lightning-rl runner`` as real processes on a SQLite store file: a worker killed with SIGKILL in
the middle of a rollout, several supervised workers, and command-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lightning_rl import semconv
from lightning_rl.cli import main
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import AttemptStatus, LLMResource, RolloutConfig, RolloutRequest, RolloutStatus, Task

AGENTS = Path(__file__).parent  # holds runner_agents.py


def _runner(db: Path, agent: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lightning_rl.cli",
        "runner",
        "--store",
        str(db),
        "--agent",
        f"runner_agents:{agent}",
        "--poll-interval",
        "0.1",
        "--heartbeat-interval",
        "0.2",
        "--log-level",
        "WARNING",
        *extra,
    ]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AGENTS), env.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "store.db")
    await s.add_resources(llm=LLMResource(base_url="http://127.0.0.1:4748", model="tiny"))
    yield s
    await s.close()


async def test_a_worker_killed_mid_rollout_is_replaced_and_the_rollout_completes(
    store: SQLiteStore, tmp_path: Path
) -> None:
    db, marker = tmp_path / "store.db", tmp_path / "started"
    config = RolloutConfig(heartbeat_timeout_s=1.0, max_attempts=2)
    await store.enqueue([RolloutRequest(id="ro-orphan", task=Task(input={"marker": str(marker)}), config=config)])
    procs: list[subprocess.Popen[str]] = []
    first_log = tmp_path / "first.log"
    try:
        with first_log.open("w") as log:
            first = subprocess.Popen(
                _runner(db, "hang_on_first_attempt", "--worker-id", "first"),
                env=_env(),
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )
        procs.append(first)
        for _ in range(400):  # the agent writes the marker once it is running the rollout
            if marker.exists() or first.poll() is not None:
                break
            await asyncio.sleep(0.05)
        assert marker.exists(), f"the first worker never started the rollout: {first_log.read_text()}"
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        # orphaned: still running in the store until its heartbeat timeout passes, then requeued
        assert (await store.get_rollout("ro-orphan")).status in (RolloutStatus.RUNNING, RolloutStatus.REQUEUED)

        second = subprocess.Popen(
            _runner(db, "hang_on_first_attempt", "--worker-id", "second"),
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(second)
        ended = await store.wait_for_rollouts(["ro-orphan"], timeout_s=20)
        second.send_signal(signal.SIGTERM)  # graceful stop: exit code 0 and its counters on stdout
        out, err = second.communicate(timeout=20)
        assert second.returncode == 0, err
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert [r.status for r in ended] == [RolloutStatus.SUCCEEDED]
    assert ended[0].final_reward == 1.0
    lost, retried = await store.query_attempts("ro-orphan")
    assert (lost.worker_id, lost.status) == ("first", AttemptStatus.TIMED_OUT)
    assert lost.error is not None and "no heartbeat" in lost.error
    assert (retried.worker_id, retried.status, retried.number) == ("second", AttemptStatus.SUCCEEDED, 2)
    signals = await store.query_spans(attempt_id=retried.id, name=semconv.SPAN_SIGNAL)
    assert [s.attributes[semconv.SIGNAL_VALUE] for s in signals] == [2.0]
    stats = json.loads(out.strip().splitlines()[-1])
    assert (stats["worker_id"], stats["claimed"], stats["succeeded"], stats["failed"]) == ("second", 1, 1, 0)


async def test_several_supervised_worker_processes_drain_the_queue(store: SQLiteStore, tmp_path: Path) -> None:
    ids = [r.id for r in await store.enqueue([RolloutRequest(task=Task(input={"x": i})) for i in range(6)])]
    proc = await asyncio.create_subprocess_exec(
        *_runner(tmp_path / "store.db", "quick", "--workers", "2", "--concurrency", "1", "--until-idle"),
        "--worker-id",
        "w",
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    rollouts = await store.query_rollouts(ids=ids)
    assert all(r.status is RolloutStatus.SUCCEEDED for r in rollouts)
    assert sorted(r.final_reward or 0.0 for r in rollouts) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    workers = {a.worker_id for r in rollouts for a in await store.query_attempts(r.id)}
    assert workers and workers <= {"w-0", "w-1"}
    reports = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert sorted(r["worker_id"] for r in reports) == ["w-0", "w-1"]
    assert sum(r["succeeded"] for r in reports) == 6


async def test_the_supervisor_restarts_a_killed_worker(store: SQLiteStore, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    config = RolloutConfig(heartbeat_timeout_s=1.0, max_attempts=2)
    await store.enqueue([RolloutRequest(id="ro-1", task=Task(input={"marker": str(marker)}), config=config)])
    log = tmp_path / "supervisor.log"
    with log.open("w") as err:
        supervisor = subprocess.Popen(
            _runner(tmp_path / "store.db", "hang_on_first_attempt", "--workers", "2", "--worker-id", "w"),
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        for _ in range(400):
            if marker.exists() and marker.read_text():
                break
            await asyncio.sleep(0.05)
        os.kill(int(marker.read_text()), signal.SIGKILL)  # the worker process running the rollout
        ended = await store.wait_for_rollouts(["ro-1"], timeout_s=20)
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(20) == 0, log.read_text()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
    assert [r.status for r in ended] == [RolloutStatus.SUCCEEDED]
    assert "exited with code -9; restarting it" in log.read_text()
    attempts = await store.query_attempts("ro-1")
    assert [a.status for a in attempts] == [AttemptStatus.TIMED_OUT, AttemptStatus.SUCCEEDED]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--store", "memory://", "--agent", "runner_agents:quick"], "private to the runner process"),
        (["--store", "{db}", "--agent", "no_colon"], "package.module:function"),
        (["--store", "{db}", "--agent", "no_such_module_xyz:agent"], "cannot import agent module"),
        (["--store", "{db}", "--agent", "runner_agents:missing"], "has no attribute"),
        (["--store", "{db}", "--agent", "runner_agents:quick", "--concurrency", "0"], "at least 1"),
    ],
)
def test_command_line_errors_say_what_to_do(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(AGENTS))
    code = main(["runner", *(a.format(db=tmp_path / "store.db") for a in argv)])
    assert code == 2
    assert message in capsys.readouterr().err
