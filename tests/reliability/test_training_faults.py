"""Issue 26: kill -9 of the store server and of a runner during a short real training run.

The trainer (tiny model, 3 GRPO steps) keeps its SQLite store; runner processes reach it through a
``lightning-rl store serve`` process over HTTP. Mid-run the store server is killed with SIGKILL and
restarted on the same port, then the runner is killed with SIGKILL and replaced. Training must
finish every step, and no rollout the store had acknowledged as ended may be lost or changed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lightning_rl.backends.torch_backend import TorchBackendConfig  # noqa: E402
from lightning_rl.store.sqlite import SQLiteStore  # noqa: E402
from lightning_rl.trainer import Trainer, TrainerConfig, TrainResult  # noqa: E402
from lightning_rl.types import Rollout, RolloutStatus, Task  # noqa: E402

AGENTS = Path(__file__).parent  # holds reliability_agents.py


@pytest.fixture(scope="module")
def tiny_model_path() -> Path:
    from lightning_rl.engine.tiny import default_tiny_model

    return default_tiny_model()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AGENTS), os.environ.get("PYTHONPATH")) if p)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _store_server(db: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "lightning_rl.cli", "store", "serve", "--path", str(db), "--port", str(port)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    assert b" at http" in proc.stdout.readline(), "the store server did not start"
    return proc


def _runner(url: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "lightning_rl.cli", "runner", "--store", url]
    cmd += ["--agent", "reliability_agents:calls_the_model", "--concurrency", "4", "--poll-interval", "0.1"]
    cmd += ["--heartbeat-interval", "0.3", "--log-level", "WARNING"]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=out)


async def _stats(db: Path) -> object:
    store = SQLiteStore(db)
    try:
        return await store.stats()
    finally:
        await store.close()


async def _ended(db: Path) -> dict[str, Rollout]:
    store = SQLiteStore(db)
    try:
        return {r.id: r for r in await store.query_rollouts(limit=1000) if r.ended_at is not None}
    finally:
        await store.close()


@pytest.mark.slow
def test_kill_9_of_the_store_server_and_of_a_runner_mid_training(tmp_path: Path, tiny_model_path: Path) -> None:
    tasks = [Task(input={"q": f"task {i}"}) for i in range(3)]
    cfg = TrainerConfig(
        model=str(tiny_model_path),
        run_dir=str(tmp_path / "run"),
        steps=3,
        batch_size=3,
        group_size=2,
        max_tokens=8,
        val_every=0,
        concurrency=0,  # rollouts are run by the runner processes below, through the store server
        heartbeat_timeout_s=2.0,
        max_attempts=5,  # attempts lost with a killed process are retried
        tensorboard=False,
        progress=False,
        backend=TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
    )
    outcome: dict[str, TrainResult | BaseException] = {}

    def train() -> None:
        try:
            outcome["result"] = Trainer(cfg).fit(None, tasks)
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=train)
    thread.start()
    db = tmp_path / "run" / "store.sqlite"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + 60
        while not db.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        procs.append(_store_server(db, port))
        log = tmp_path / "runners.log"
        procs.append(_runner(url, log))
        deadline = time.monotonic() + 240  # generous: a loaded 2-core machine starts the trainer slowly
        while not asyncio.run(_ended(db)) and time.monotonic() < deadline:
            time.sleep(0.2)
        before = asyncio.run(_ended(db))
        assert before, f"no rollout ended in 240 s; {asyncio.run(_stats(db))}; runner log: {log.read_text()[-3000:]}"

        procs[0].send_signal(signal.SIGKILL)  # the store server, mid-run
        procs[0].wait(10)
        time.sleep(0.5)
        procs.append(_store_server(db, port))
        procs[1].send_signal(signal.SIGKILL)  # the runner, mid-run
        procs[1].wait(10)
        procs.append(_runner(url, log))

        thread.join(timeout=300)
        assert not thread.is_alive(), f"training did not finish; runner log: {log.read_text()[-3000:]}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert isinstance(result, TrainResult)
    assert [r["step"] for r in result.history if "train/reward_mean" in r] == [1, 2, 3]
    after = asyncio.run(_ended(db))
    for rid, rollout in before.items():  # nothing acknowledged was lost or changed
        assert after[rid].status is rollout.status and after[rid].final_reward == rollout.final_reward
    assert len(after) == 3 * 3 * 2  # every rollout of the 3 steps ended: none was left running
    others = {r.id: (r.status.value, r.error) for r in after.values() if r.status is not RolloutStatus.SUCCEEDED}
    assert all(error for _, error in others.values()), others  # each failure says why
    assert len(others) <= len(after) // 2, others  # the kills cost the rollouts in flight, not the run
