"""Issue 26: kill -9 of the store server, of a runner and of the trainer during a short real training run.

The trainer (tiny model, GRPO steps) keeps its SQLite store; runner processes reach it through a
``lightning-rl store serve`` process over HTTP. In the first test, mid-run the store server is
killed with SIGKILL and restarted on the same port, then the runner is killed with SIGKILL and
replaced. In the second, the trainer process itself is killed: with it go the gateway the runners
call and the engine behind it (the embedded services live in the trainer's process), and it is
started again with ``resume``. Training must finish every step, and no rollout the store had
acknowledged as ended may be lost or changed.
"""

from __future__ import annotations

import asyncio
import json
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
from lightning_rl.types import Rollout, RolloutStatus, StoreStats, Task  # noqa: E402

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


async def _stats(db: Path) -> StoreStats:
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


async def _unended(db: Path) -> dict[str, int]:
    """Rollouts per status that has not ended (queued, running, requeued)."""
    by_status = (await _stats(db)).rollouts_by_status
    return {s: n for s, n in by_status.items() if n and s in ("queued", "running", "requeued")}


STEPS = 8
"""Of the run the trainer test kills: enough that the kill lands mid-run on a fast machine too."""


def _trainer(run_dir: Path, model: Path, mode: str, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, str(AGENTS / "reliability_trainer.py"), str(run_dir), str(model), mode, str(STEPS)]
    with log.open("ab") as err:
        return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=err)


@pytest.mark.slow
def test_kill_9_of_the_trainer_and_its_gateway_mid_training_then_resume(tmp_path: Path, tiny_model_path: Path) -> None:
    run_dir = tmp_path / "run"
    db = run_dir / "store.sqlite"
    latest = run_dir / "checkpoints" / "latest"
    log = tmp_path / "processes.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        trainer = _trainer(run_dir, tiny_model_path, "fresh", log)
        procs.append(trainer)
        deadline = time.monotonic() + 120
        while not db.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        procs.append(_store_server(db, port))
        procs.append(_runner(url, log))
        deadline = time.monotonic() + 300  # generous: a loaded 2-core machine
        while not latest.exists() and time.monotonic() < deadline and trainer.poll() is None:
            time.sleep(0.02)
        assert latest.exists(), f"no checkpoint in 300 s; log: {log.read_text()[-3000:]}"
        trainer.send_signal(signal.SIGKILL)  # the trainer, its gateway and its engine, mid-run
        trainer.wait(10)
        before = asyncio.run(_ended(db))
        resumed_from = int(latest.read_text().strip().removeprefix("step_"))
        assert 1 <= resumed_from < STEPS, "the run ended before it could be killed: make it longer"

        trainer = _trainer(run_dir, tiny_model_path, "resume", log)  # the runner keeps running
        procs.append(trainer)
        out, _ = trainer.communicate(timeout=400)
        assert trainer.returncode == 0, f"the resumed run failed; log: {log.read_text()[-3000:]}"
        trained = json.loads(out.decode().strip().splitlines()[-1])
        assert trained == list(range(resumed_from + 1, STEPS + 1)), trained  # on from the checkpoint, to the end

        deadline = time.monotonic() + 60  # the killed run's last rollouts end too (their gateway is gone)
        while time.monotonic() < deadline:
            if not asyncio.run(_unended(db)):
                break
            time.sleep(0.5)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    after = asyncio.run(_ended(db))
    for rid, rollout in before.items():  # nothing acknowledged was lost or changed
        assert after[rid].status is rollout.status and after[rid].final_reward == rollout.final_reward
    assert not asyncio.run(_unended(db))  # none was left running
    others = {r.id: (r.status.value, r.error) for r in after.values() if r.status is not RolloutStatus.SUCCEEDED}
    assert all(error for _, error in others.values()), others  # each failure says why
