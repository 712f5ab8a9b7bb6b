"""The trainer with external runner processes (``concurrency=0``): one dies mid-rollout, training goes on."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.trainer import Trainer, TrainerConfig, TrainResult
from lightning_rl.types import AttemptStatus, Task

AGENTS = Path(__file__).parent  # holds worker_agents.py


def _runner(db: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(AGENTS), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "lightning_rl.cli", "runner", "--store", str(db), "--agent", "worker_agents:dies_once"]
    cmd += ["--concurrency", "4", "--poll-interval", "0.1", "--heartbeat-interval", "0.2", "--log-level", "ERROR"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def _attempt_statuses(db: Path) -> list[AttemptStatus]:
    store = SQLiteStore(db)
    try:
        rollouts = await store.query_rollouts(limit=100)
        return [a.status for r in rollouts for a in await store.query_attempts(r.id)]
    finally:
        await store.close()


def test_a_runner_process_killed_mid_rollout_is_counted_and_training_finishes(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    marker = tmp_path / "died"
    tasks = [Task(input={"q": f"task {i}", "die": i == 0, "marker": str(marker)}) for i in range(3)]
    cfg = TrainerConfig(
        model=str(tiny_model_path),
        run_dir=str(tmp_path / "run"),
        steps=2,
        batch_size=3,
        group_size=2,
        max_tokens=8,
        val_every=0,
        concurrency=0,  # rollouts are run by the worker processes below
        heartbeat_timeout_s=2.0,
        max_attempts=1,
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
    deadline = time.monotonic() + 60
    while not db.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [_runner(db), _runner(db)]
    try:
        thread.join(timeout=120)
        assert not thread.is_alive(), "training did not finish"
    finally:
        for w in workers:
            w.kill()
            w.wait()
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert isinstance(result, TrainResult)
    assert marker.exists()  # a worker did die mid-rollout
    assert sum(w.returncode == -9 for w in workers) >= 1  # killed by SIGKILL (the other was killed by the test)
    rows = [r for r in result.history if "train/reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    # The dead worker's attempts expired (heartbeats stopped), so their rollouts (out of attempts)
    # ended as failures: counted, and left out of the update. Any rollout that worker held at that
    # moment shares that fate, so count at least one.
    assert rows[0]["train/failed_rollouts"] + rows[0]["train/timed_out_rollouts"] >= 1
    statuses = asyncio.run(_attempt_statuses(db))
    assert statuses.count(AttemptStatus.TIMED_OUT) >= 1 and AttemptStatus.SUCCEEDED in statuses
    for row in rows:
        assert row["train/n_rollouts"] + row["train/timed_out_rollouts"] + row["train/failed_rollouts"] == 6
        assert row["train/n_transitions"] == row["train/n_rollouts"]  # one call each, none from lost attempts
