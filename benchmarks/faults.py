"""Kill -9 figures: what a crash of the store server, a runner or the trainer costs, over several trials.

Real processes only (``lightning-rl store serve``, ``lightning-rl runner``, a ``Trainer`` in its own
process on the tiny model), each killed with SIGKILL at a random moment of real work:

* **store**: 8 concurrent writers send span batches to ``store serve`` over HTTP; the server is
  killed and restarted on the same SQLite file. Counts spans acknowledged (HTTP 200) and, after the
  restart, how many of those are missing, and how long the restart took to answer.
* **runner**: a runner works through 24 rollouts (agents that sleep 0.5 s; heartbeat timeout 2 s,
  2 attempts each); it is killed mid-work and a new one started. Counts rollouts that succeeded or
  failed (never lost, never left running) and the time from the kill until all had ended.
* **trainer**: a 6-step GRPO run with an external runner is killed right after its first checkpoint
  (its gateway and engine die with it) and started again with ``resume``. Reports the step it
  resumed from, whether every step then trained, and how many rollouts that had ended before the
  kill were changed or missing afterwards.

    uv run python benchmarks/faults.py               # 5 trials of each
    uv run python benchmarks/faults.py --trials 2 --only store
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from lightning_rl.store.client import StoreClient
from lightning_rl.store.sqlite import SQLiteStore
from lightning_rl.types import TERMINAL_ROLLOUT, LLMResource, RolloutConfig, RolloutRequest, Span, Task

__all__ = ["main"]

AGENTS = """
import asyncio


async def sleeper(task, llm):
    await asyncio.sleep(task["seconds"])
    return 1.0


async def calls_the_model(task, llm):
    client = llm.async_openai_client(max_retries=2)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["q"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()
    return (len(reply.choices[0].message.content or "") % 5) / 4
"""

TRAINER = """
import json, sys
from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.trainer import Trainer, TrainerConfig
from lightning_rl.types import Task

run_dir, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = TrainerConfig(
    model="tiny", run_dir=run_dir, steps=steps, batch_size=3, group_size=2, max_tokens=8, val_every=0,
    concurrency=0, heartbeat_timeout_s=2.0, max_attempts=3, checkpoint_every=1, resume=mode == "resume",
    tensorboard=False, progress=False, backend=TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
)
result = Trainer(cfg).fit(None, [Task(input={"q": f"task {i}"}) for i in range(3)])
print(json.dumps([int(r["step"]) for r in result.history if "train/reward_mean" in r]), flush=True)
"""

TRAINER_STEPS = 6


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=5, help="Kills per scenario.")
    p.add_argument("--only", choices=["store", "runner", "trainer"], help="Run one scenario.")
    p.add_argument("--seed", type=int, default=0, help="Seeds the random kill moments.")
    return p.parse_args(argv)


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lightning_rl.cli", *args]


def _serve(db: Path, port: int, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], float]:
    """Start ``store serve``; returns the process and the seconds until it said it was listening."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        _cli("store", "serve", "--path", str(db), "--port", str(port)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    if b" at http" not in proc.stdout.readline():
        raise RuntimeError("the store server did not start")
    return proc, time.perf_counter() - t0


def _runner(store: str, agent: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = _cli("runner", "--store", store, "--agent", agent, "--concurrency", "4", "--poll-interval", "0.1")
    cmd += ["--heartbeat-interval", "0.3", "--log-level", "WARNING"]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=out)


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


# --- store ---------------------------------------------------------------------------------------
async def store_trial(folder: Path, rng: random.Random) -> dict[str, float]:
    db, port, env = folder / "store.db", _free_port(), _env(folder)
    proc, _ = _serve(db, port, env)
    url = f"http://127.0.0.1:{port}"
    acknowledged: list[str] = []
    try:
        async with StoreClient(url, retries=0) as client:
            await client.enqueue([RolloutRequest(id=f"r{i}", task=Task(input=i)) for i in range(8)])
            claims = await client.claim("bench", n=8)

            async def write(claim_index: int) -> None:
                claim = claims[claim_index]
                a_id = claim.attempt.id
                for batch in range(1_000_000):
                    spans = [
                        Span(name=f"w{claim_index}-{batch}-{i}", rollout_id=claim.rollout.id, attempt_id=a_id)
                        for i in range(20)
                    ]
                    try:
                        await client.add_spans(spans)
                    except Exception:
                        return  # the server is gone: this batch was not acknowledged
                    acknowledged.extend(s.span_id for s in spans)

            writers = [asyncio.create_task(write(i)) for i in range(len(claims))]
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            proc.send_signal(signal.SIGKILL)
            await asyncio.gather(*writers)
        proc.wait(10)
    finally:
        _stop(proc)
    proc, restart_s = _serve(db, port, env)
    try:
        async with StoreClient(url) as client:
            stored = {s.span_id for c in claims for s in await client.query_spans(attempt_id=c.attempt.id)}
    finally:
        _stop(proc)
    return {"acknowledged": len(acknowledged), "lost": len(set(acknowledged) - stored), "restart_s": restart_s}


# --- runner --------------------------------------------------------------------------------------
async def runner_trial(folder: Path, rng: random.Random) -> dict[str, float]:
    db, env, log = folder / "store.db", _env(folder), folder / "runner.log"
    store = SQLiteStore(db)
    ids = [f"r{i}" for i in range(24)]
    try:
        await store.add_resources(llm=LLMResource(base_url="http://127.0.0.1:9", model="unused"))  # agents need one
        config = RolloutConfig(heartbeat_timeout_s=2.0, max_attempts=2)
        await store.enqueue([RolloutRequest(id=i, task=Task(input={"seconds": 0.5}), config=config) for i in ids])
        first = _runner(str(db), "faults_agents:sleeper", env, log)
        await asyncio.sleep(rng.uniform(1.5, 3.0))  # the runner is mid-work: 4 rollouts in flight
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_at = time.perf_counter()
        second = _runner(str(db), "faults_agents:sleeper", env, log)
        try:
            ended = await store.wait_for_rollouts(ids, timeout_s=120)
            recovered_s = time.perf_counter() - killed_at
        finally:
            _stop(second)
        by_status = {s.value: sum(r.status is s for r in ended) for s in TERMINAL_ROLLOUT}
        still_open = len(ids) - len(ended)
    finally:
        await store.close()
    return {
        "rollouts": len(ids),
        "succeeded": by_status.get("succeeded", 0),
        "not_succeeded": len(ended) - by_status.get("succeeded", 0),
        "left_open": still_open,
        "recovered_s": recovered_s,
    }


# --- trainer -------------------------------------------------------------------------------------
async def _ended(db: Path) -> dict[str, tuple[str, float | None]]:
    store = SQLiteStore(db)
    try:
        return {r.id: (r.status.value, r.final_reward) for r in await store.query_rollouts(limit=10_000) if r.ended_at}
    finally:
        await store.close()


def trainer_trial(folder: Path, _rng: random.Random) -> dict[str, float]:
    run_dir, env, log = folder / "run", _env(folder), folder / "trainer.log"
    db, latest = run_dir / "store.sqlite", run_dir / "checkpoints" / "latest"

    def trainer(mode: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, str(folder / "faults_trainer.py"), str(run_dir), mode, str(TRAINER_STEPS)]
        with log.open("ab") as err:
            return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err)

    first = trainer("fresh")
    procs = [first]
    try:
        deadline = time.monotonic() + 300
        while not db.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.05)
        if not db.exists():
            raise RuntimeError(f"the trainer did not start: {log.read_text()[-2000:]}")
        port = _free_port()
        server, _ = _serve(db, port, env)
        procs += [server, _runner(f"http://127.0.0.1:{port}", "faults_agents:calls_the_model", env, log)]
        while not latest.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)  # right after the first checkpoint: the next step is in flight
        first.wait(10)
        if not latest.exists():
            raise RuntimeError(f"the trainer wrote no checkpoint: {log.read_text()[-2000:]}")
        resumed_from = int(latest.read_text().strip().removeprefix("step_"))
        before = asyncio.run(_ended(db))
        second = trainer("resume")
        procs.append(second)
        out, _ = second.communicate(timeout=600)
        trained = json.loads(out.decode().strip().splitlines()[-1]) if second.returncode == 0 else []
    finally:
        _stop(*procs)
    after = asyncio.run(_ended(db))
    return {
        "resumed_from": resumed_from,
        "all_steps_trained": float(trained == list(range(resumed_from + 1, TRAINER_STEPS + 1))),
        "ended_before_kill": len(before),
        "lost_or_changed": sum(after.get(k) != v for k, v in before.items()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    scenarios = [args.only] if args.only else ["store", "runner", "trainer"]
    results: dict[str, list[dict[str, float]]] = {}
    for name in scenarios:
        for trial in range(args.trials):
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                (folder / "faults_agents.py").write_text(AGENTS)
                (folder / "faults_trainer.py").write_text(TRAINER)
                if name == "store":
                    row = asyncio.run(store_trial(folder, rng))
                elif name == "runner":
                    row = asyncio.run(runner_trial(folder, rng))
                else:
                    row = trainer_trial(folder, rng)
            results.setdefault(name, []).append(row)
            print(f"  {name} trial {trial + 1}/{args.trials}: {row}", file=sys.stderr, flush=True)

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    flags = "".join(f" --{k} {v}" for k, v in (("trials", args.trials), ("only", args.only)) if v and v != 5)
    print(
        f"Generated {stamp} at commit `{commit}` by `uv run python benchmarks/faults.py{flags}` "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})."
    )
    print()
    print("| killed (SIGKILL) | trials | what was at stake | lost | other figures |")
    print("|---|---:|---|---:|---|")
    if rows := results.get("store"):
        print(
            f"| store server, 8 writers over HTTP | {len(rows)} | {sum(r['acknowledged'] for r in rows):.0f} "
            f"acknowledged spans | **{sum(r['lost'] for r in rows):.0f}** | restart answered in "
            f"{min(r['restart_s'] for r in rows):.1f}-{max(r['restart_s'] for r in rows):.1f} s |"
        )
    if rows := results.get("runner"):
        print(
            f"| runner, 4 rollouts in flight | {len(rows)} | {sum(r['rollouts'] for r in rows):.0f} rollouts | "
            f"**{sum(r['left_open'] for r in rows):.0f}** left open | {sum(r['succeeded'] for r in rows):.0f} "
            f"succeeded, {sum(r['not_succeeded'] for r in rows):.0f} ended otherwise (with an error); all ended "
            f"{min(r['recovered_s'] for r in rows):.1f}-{max(r['recovered_s'] for r in rows):.1f} s after the kill |"
        )
    if rows := results.get("trainer"):
        print(
            f"| trainer (+ its gateway and engine), then `resume` | {len(rows)} | "
            f"{sum(r['ended_before_kill'] for r in rows):.0f} rollouts ended before the kill | "
            f"**{sum(r['lost_or_changed'] for r in rows):.0f}** lost or changed | resumed from step "
            f"{', '.join(str(int(r['resumed_from'])) for r in rows)}; every later step trained in "
            f"{sum(r['all_steps_trained'] for r in rows):.0f} of {len(rows)} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
