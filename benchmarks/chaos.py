"""Chaos on a team's deployment shape: overlapping kills and pauses while the demo agent trains.

The shape (issue 45): a private database server (PostgreSQL, or Redis with the append-only file at
``appendfsync everysec`` or ``always``), ``lightning-rl store serve`` on it, three ``lightning-rl
runner`` processes running the demo's unchanged calculator agent, and the trainer (the demo's RL
phase, its gateway and engine in its process) talking to the store server over HTTP. Every 30-90 s
(``--interval``) the chaos loop picks a random component that is not already down and kills it
(SIGKILL, restarted 1-8 s later), pauses it (SIGSTOP, SIGCONT 3-20 s later), restarts the database
cleanly, or kills the trainer the moment a checkpoint folder appears (mid-save). Faults are not
serialised: a new one starts while earlier ones are still in progress (counted as overlapping), and
one fault in three brings a second one with it at once. A supervisor restarts any process that exits
on its own, as systemd or Kubernetes would; the trainer always restarts with ``resume``.

Beside them an auditor writes through the same store server like any client: a batch of spans every
0.25 s and an evaluation rollout (mode ``test``, run by the runners) every 3 s, and records what was
acknowledged (HTTP 200).

Afterwards (chaos stops, the trainer finishes, the runners drain the queue) it checks and prints:
every acknowledged span and rollout is in the store; every rollout an update used is still there
with the status it had; no rollout was counted twice in an update (nor in two updates) and each
counted rollout has exactly one succeeded attempt; no attempt or rollout is left running or queued;
the run reached its last step (``checkpoints/latest``); the metrics have a train row for every step;
held-out reward rose from the first validation to the last. Exit status 1 if any check fails.

    uv run python benchmarks/chaos.py --backend postgres --minutes 30
    uv run python benchmarks/chaos.py --backend redis-always --minutes 30
    uv run python benchmarks/chaos.py --quick --minutes 1.5 --backend postgres --seed 1   # CI (and redis-always)

``--quick`` trains the untrained tiny model (no 2-minute warm start), so it checks everything but
learning, and spreads its few faults over the components (the one hit least so far is next). The
full run warm-starts once (``--warm-start``, reused when present).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from _chaos_procs import Component, PostgresServer, RedisServer, Runner, StoreServer, TrainerProc
from _common import generated_line

from lightning_rl.demo.calculator import make_tasks
from lightning_rl.store.client import StoreClient
from lightning_rl.types import TERMINAL_ROLLOUT, AttemptStatus, RolloutConfig, RolloutRequest, Span, Task

__all__ = ["main"]

WARM_START = r"""
import sys
from pathlib import Path
from lightning_rl.demo.calculator import make_tasks
from lightning_rl.demo.run import DemoConfig, warm_start
from lightning_rl.engine.models import resolve_model

cfg = DemoConfig(seed=0, progress=False)
tasks = make_tasks(cfg.n_train + cfg.n_val + cfg.n_probe, seed=cfg.seed)
warm_start(resolve_model("tiny"), Path(sys.argv[1]), cfg, tasks[: cfg.n_train], tasks[cfg.n_train + cfg.n_val :])
"""

AUDIT_ROLLOUT = "chaos-audit"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["postgres", "redis-everysec", "redis-always"], default="postgres")
    p.add_argument(
        "--minutes", type=float, default=None, help="How long the chaos loop injects faults (30; --quick 3)."
    )
    p.add_argument("--interval", default="30,90", help="Seconds between faults: LOW,HIGH (uniform).")
    p.add_argument("--steps", type=int, default=60, help="RL steps (extended while chaos time remains).")
    p.add_argument("--batch", type=int, default=16, help="Tasks per step (8 rollouts each).")
    p.add_argument("--n-val", type=int, default=50, help="Held-out tasks per validation.")
    p.add_argument("--warm-start", default="runs/chaos/warm_start", help="The demo's warm start (built if absent).")
    p.add_argument("--out", default=None, help="Run folder (default runs/chaos/<backend>).")
    p.add_argument("--seed", type=int, default=0, help="Seeds the fault schedule.")
    p.add_argument("--quick", action="store_true", help="CI: 3 minutes, faults every 8-20 s, untrained tiny model.")
    return p.parse_args(argv)


@dataclass
class Fault:
    kind: str
    target: str
    started: float
    ended: float | None = None
    recovered_s: float | None = None
    overlapping: bool = False


@dataclass
class Progress:
    """What the system has done so far, polled through the store server (the recovery signals)."""

    acked_spans: list[str] = field(default_factory=list[str])
    acked_rollouts: list[str] = field(default_factory=list[str])
    resources_version: int = 0
    ended: int = 0


class Chaos:
    def __init__(self, args: argparse.Namespace, folder: Path) -> None:
        self.args = args
        self.folder = folder
        self.rng = random.Random(args.seed)
        self.quick: bool = args.quick
        lo, hi = (float(x) for x in args.interval.split(","))
        self.interval = (lo, hi)
        if args.backend == "postgres":
            pg = PostgresServer(folder)
            self.db: Component = pg
            where = pg.dsn
        else:
            redis = RedisServer(folder, args.backend.removeprefix("redis-"))
            self.db, where = redis, redis.url
        self.store = StoreServer(folder, "postgres" if args.backend == "postgres" else "redis", where)
        self.runners = [Runner(folder, i, self.store.url, concurrency=16) for i in range(3)]
        model = "tiny" if self.quick else str(Path(args.warm_start).resolve())
        self.trainer = TrainerProc(folder, model, self.store.url, args.steps, args.n_val, args.batch)
        self.components: list[Component] = [self.db, self.store, *self.runners, self.trainer]
        self.busy: set[str] = set()  # components under a fault right now: the supervisor leaves them be
        self.faults: list[Fault] = []
        self.progress = Progress()
        self.trainer_done = False
        self.extensions = 0
        self.trainer_output: list[str] = []

    # --- the pieces running during the chaos -------------------------------------------------
    async def supervise(self) -> None:
        """Restart whatever exits on its own (as a service manager would); note the trainer's end."""
        while True:
            for comp in self.components:
                if comp.name in self.busy or comp.alive() or (comp is self.trainer and self.trainer_done):
                    continue
                assert comp.proc is not None
                code = comp.proc.returncode
                if comp is self.trainer:
                    self._read_trainer_output()
                    if code == 0:
                        if self.chaos_left() > 0:  # the run ended before the chaos: train on, longer
                            self.trainer.steps += self.args.steps
                            self.extensions += 1
                            self.trainer.start()
                        else:
                            self.trainer_done = True
                        continue
                comp.unexpected_exits.append(code)
                comp.start()
            await asyncio.sleep(0.5)

    def _read_trainer_output(self) -> None:
        proc = self.trainer.proc
        if proc is not None and proc.stdout is not None:
            out = proc.stdout.read().decode(errors="replace").strip()
            proc.stdout.close()
            if out:
                self.trainer_output.append(out.splitlines()[-1])

    async def audit(self) -> None:
        """Write through the store server like any client; keep what it acknowledged."""
        n = 0
        audit_tasks = make_tasks(500, seed=self.args.seed + 1000)
        async with StoreClient(self.store.url, retries=0, timeout_s=5.0) as client:
            next_rollout = time.monotonic()
            while True:
                n += 1
                spans = [
                    Span(name=f"audit-{n}-{i}", rollout_id=AUDIT_ROLLOUT, attempt_id=self.audit_attempt)
                    for i in range(10)
                ]
                try:
                    await client.add_spans(spans)
                    self.progress.acked_spans.extend(s.span_id for s in spans)
                except Exception:
                    pass  # not acknowledged: it may or may not be stored, and neither is a loss
                if time.monotonic() >= next_rollout:
                    next_rollout += 3.0
                    rid = f"audit-r{n}"
                    task = audit_tasks[len(self.progress.acked_rollouts) % len(audit_tasks)]
                    config = RolloutConfig(heartbeat_timeout_s=10.0, max_attempts=3, timeout_s=120.0)
                    try:
                        await client.enqueue([RolloutRequest(id=rid, task=task, mode="test", config=config)])
                        self.progress.acked_rollouts.append(rid)
                    except Exception:
                        pass
                await asyncio.sleep(0.25)

    async def watch(self) -> None:
        """Poll the recovery signals: the latest resources version and how many rollouts ended."""
        async with StoreClient(self.store.url, retries=0, timeout_s=5.0) as client:
            while True:
                try:
                    stats = await client.stats()
                    self.progress.ended = sum(stats.rollouts_by_status.get(s.value, 0) for s in TERMINAL_ROLLOUT)
                    self.progress.resources_version = (await client.get_resources(None)).version
                except Exception:
                    pass
                await asyncio.sleep(0.25)

    def chaos_left(self) -> float:
        return self.chaos_until - time.monotonic()

    async def inject(self) -> None:
        """Start a fault every ``interval`` seconds, without waiting for the previous ones to end."""
        tasks: list[asyncio.Task[None]] = []
        while self.chaos_left() > 0:
            await asyncio.sleep(self.rng.uniform(*self.interval))
            if self.chaos_left() <= 0:
                break
            tasks.append(asyncio.create_task(self.one_fault()))
            if self.rng.random() < 1 / 3:
                tasks.append(asyncio.create_task(self.one_fault()))
        await asyncio.gather(*tasks)

    async def one_fault(self) -> None:
        idle = [c for c in self.components if c.name not in self.busy and c.alive()]
        if not idle:
            return
        if self.quick:  # a short run has few faults: spread them so every component gets some
            hits = Counter(f.target for f in self.faults)
            fewest = min(hits[c.name] for c in idle)
            idle = [c for c in idle if hits[c.name] == fewest]
        comp = self.rng.choice(idle)
        kinds = ["kill", "pause"]
        if comp is self.db:
            kinds.append("clean restart")
        if comp is self.trainer:
            kinds.append("kill mid-checkpoint")
        kind = self.rng.choice(kinds)
        self.busy.add(comp.name)
        fault = Fault(kind, comp.name, time.monotonic(), overlapping=len(self.busy) > 1)
        self.faults.append(fault)
        print(f"  {time.strftime('%H:%M:%S')} {kind} {comp.name}", file=sys.stderr, flush=True)
        down = (0.5, 3.0) if self.quick else (1.0, 8.0)
        paused = (2.0, 6.0) if self.quick else (3.0, 20.0)
        try:
            if kind == "pause":
                comp.pause()
                await asyncio.sleep(self.rng.uniform(*paused))
                comp.resume()
            else:
                if kind == "kill mid-checkpoint":
                    await asyncio.to_thread(self.trainer.wait_checkpoint_started, 300.0)
                    fault.started = time.monotonic()  # recovery counts from the kill, not the wait
                if kind == "clean restart":
                    comp.stop()
                else:
                    comp.kill()
                if comp is self.trainer:
                    self._read_trainer_output()
                await asyncio.sleep(self.rng.uniform(*down))
                comp.start()
        finally:
            self.busy.discard(comp.name)
        fault.ended = time.monotonic()
        fault.recovered_s = await self.recovery(comp, fault.started)

    async def recovery(self, comp: Component, since: float) -> float | None:
        """Seconds from the fault's start until the system made progress again through ``comp``."""
        p = self.progress
        acked, version, ended = len(p.acked_spans), p.resources_version, p.ended
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if comp is self.trainer:
                done = p.resources_version > version or self.trainer_done
            elif comp in self.runners:
                done = p.ended > ended
            else:
                done = len(p.acked_spans) > acked
            if done:
                return time.monotonic() - since
            await asyncio.sleep(0.1)
        return None

    # --- the run ----------------------------------------------------------------------------
    async def run(self) -> dict[str, object]:
        started = time.monotonic()
        try:
            await self._run(started)
            result = await self.check()
        finally:
            for comp in [*self.runners, self.trainer, self.store, self.db]:
                comp.stop()
            if isinstance(self.db, PostgresServer):
                self.db.remove()
        result["wall_min"] = (time.monotonic() - started) / 60
        return result

    async def _run(self, started: float) -> None:
        for comp in [self.db, self.store]:
            comp.start()
            await self._until(comp.ready, 60, f"{comp.name} did not start; see {self.folder}/{comp.name}.log")
        await self._open_audit_attempt()
        for comp in [*self.runners, self.trainer]:
            comp.start()
        minutes = float(self.args.minutes)
        self.chaos_until = time.monotonic() + minutes * 60
        supervisor = asyncio.create_task(self.supervise())
        writers = [asyncio.create_task(t()) for t in (self.audit, self.watch)]
        try:
            await self.inject()
            print(f"  chaos over after {(time.monotonic() - started) / 60:.1f} min; finishing", file=sys.stderr)
            await self._until(lambda: self.trainer_done, 3600, "the trainer did not finish within an hour")
            for task in writers:
                task.cancel()
            await asyncio.gather(*writers, return_exceptions=True)
            async with StoreClient(self.store.url, retries=10) as client:
                await client.finish_attempt(self.audit_attempt, AttemptStatus.SUCCEEDED, reward=0.0)
            await self._drain()
        finally:
            for task in [supervisor, *writers]:
                task.cancel()
            await asyncio.gather(supervisor, *writers, return_exceptions=True)

    async def _open_audit_attempt(self) -> None:
        """The auditor's spans need a claimed attempt: claim one before any runner can (never expires)."""
        config = RolloutConfig(heartbeat_timeout_s=1e7)
        async with StoreClient(self.store.url, retries=10) as client:
            await client.enqueue([RolloutRequest(id=AUDIT_ROLLOUT, task=Task(input="audit"), config=config)])
            [claim] = await client.claim("chaos-auditor")
        self.audit_attempt = claim.attempt.id

    async def _until(self, ready: object, timeout_s: float, message: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TimeoutError(message)
            await asyncio.sleep(0.2)

    async def _drain(self) -> None:
        """Let the runners finish what is queued (orphans of killed trainers included), then stop them."""
        async with StoreClient(self.store.url, retries=10) as client:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                stats = await client.stats()
                if not any(stats.rollouts_by_status.get(s, 0) for s in ("queued", "requeued", "running")):
                    break
                await asyncio.sleep(1.0)
        for runner in self.runners:
            runner.stop()

    # --- the checks -------------------------------------------------------------------------
    async def check(self) -> dict[str, object]:
        run_dir = self.trainer.run_dir
        async with StoreClient(self.store.url, retries=10) as client:
            await client.expire()
            stored_spans: set[str] = set()
            offset = 0
            while True:
                page = await client.query_spans(rollout_id=AUDIT_ROLLOUT, limit=10_000, offset=offset)
                stored_spans.update(s.span_id for s in page)
                offset += len(page)
                if len(page) < 10_000:
                    break
            acked = self.progress.acked_rollouts
            stored_rollouts = {
                r.id: r
                for i in range(0, len(acked), 1000)
                for r in await client.query_rollouts(ids=acked[i : i + 1000])
            }
            updates = [json.loads(line) for line in (run_dir / "updates.jsonl").read_text().splitlines() if line]
            train = [u for u in updates if u["ids"] and u["ids"][0].split("-")[1].startswith("s")]
            counted = [i for u in train for i, s in zip(u["ids"], u["status"], strict=True) if s == "succeeded"]
            logged = {i: s for u in updates for i, s in zip(u["ids"], u["status"], strict=True)}
            now = {
                r.id: r.status.value
                for ids in [list(logged)[i : i + 1000] for i in range(0, len(logged), 1000)]
                for r in await client.query_rollouts(ids=ids, limit=1000)
            }
            sem = asyncio.Semaphore(16)

            async def succeeded_attempts(rid: str) -> int:
                async with sem:
                    return sum(a.status.value == "succeeded" for a in await client.query_attempts(rid))

            per_rollout = await asyncio.gather(*(succeeded_attempts(i) for i in set(counted)))
            stats = await client.stats()
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        train_steps = sorted({int(r["step"]) for r in rows if "train/reward_mean" in r})
        vals = [(int(r["step"]), float(r["val/reward_mean"])) for r in rows if "val/reward_mean" in r]
        latest = (run_dir / "checkpoints" / "latest").read_text().strip() if (run_dir / "checkpoints").exists() else ""
        steps = self.trainer.steps
        return {
            "backend": self.args.backend,
            "faults": [f.__dict__ for f in self.faults],
            "acked_spans": len(self.progress.acked_spans),
            "lost_spans": len(set(self.progress.acked_spans) - stored_spans),
            "acked_rollouts": len(acked),
            "lost_rollouts": sum(i not in stored_rollouts for i in acked),
            "update_rollouts": len(logged),
            "update_rollouts_lost_or_changed": sum(now.get(i) != s for i, s in logged.items()),
            "counted": len(counted),
            "duplicates": len(counted) - len(set(counted)) + sum(n != 1 for n in per_rollout),
            "attempts_running": stats.attempts_by_status.get("running", 0),
            "rollouts_open": sum(stats.rollouts_by_status.get(s, 0) for s in ("queued", "requeued", "running")),
            "steps": steps,
            "reached_last_step": latest == f"step_{steps:05d}",
            "metrics_continuous": train_steps == list(range(1, steps + 1)),
            "val_first": vals[0] if vals else None,
            "val_last": vals[-1] if vals else None,
            "trainer_starts": self.trainer.starts,
            "extensions": self.extensions,
            "unexpected_exits": {c.name: c.unexpected_exits for c in self.components if c.unexpected_exits},
        }


def report(result: dict[str, object], quick: bool) -> tuple[str, bool]:
    """The markdown the README pastes, and whether every check passed."""
    faults = [Fault(**f) for f in result["faults"]]  # type: ignore[union-attr]
    by_kind = Counter(f"{f.kind} {f.target.rstrip('0123456789')}" for f in faults)
    recov = [f.recovered_s for f in faults if f.recovered_s is not None]
    val_first, val_last = result["val_first"], result["val_last"]
    rose = bool(val_first and val_last and val_last[1] > val_first[1])  # type: ignore[index]
    checks = {
        "acknowledged spans lost": result["lost_spans"] == 0,
        "acknowledged rollouts lost": result["lost_rollouts"] == 0,
        "rollouts an update used, lost or changed": result["update_rollouts_lost_or_changed"] == 0,
        "rollouts counted twice": result["duplicates"] == 0,
        "attempts left running": result["attempts_running"] == 0,
        "rollouts left queued or running": result["rollouts_open"] == 0,
        "run reached its last step": bool(result["reached_last_step"]),
        "metrics continuous (a train row per step)": bool(result["metrics_continuous"]),
    }
    if not quick:
        checks["held-out reward rose"] = rose
    lines = [
        f"| {result['backend']} | {result['wall_min']:.1f} min | {len(faults)} "
        f"({sum(f.overlapping for f in faults)} overlapping) | {result['acked_spans']} spans, "
        f"{result['acked_rollouts']} rollouts | **{result['lost_spans']} + {result['lost_rollouts']}** | "
        f"**{result['duplicates']}** of {result['counted']} counted | **{result['attempts_running']}** | "
        f"{result['steps']} steps, {result['trainer_starts'] - 1 - result['extensions']} resumes | "  # type: ignore[operator]
        f"{val_first[1] if val_first else float('nan'):.2f} → {val_last[1] if val_last else float('nan'):.2f} |",  # type: ignore[index]
        "",
        "Faults by kind: " + ", ".join(f"{k} × {n}" for k, n in sorted(by_kind.items())) + ".",
        (
            f"Recovery (fault start until progress again): median {statistics.median(recov):.1f} s, "
            f"max {max(recov):.1f} s over {len(recov)} faults."
            if recov
            else "Recovery: no fault measured."
        ),
        f"Processes that exited on their own and were restarted: {result['unexpected_exits'] or 'none'}; "
        f"run extended {result['extensions']} times.",
        "",
        "| check | passed |",
        "|---|---|",
        *(f"| {name} | {'yes' if ok else '**NO**'} |" for name, ok in checks.items()),
    ]
    return "\n".join(lines), all(checks.values())


HEADER = (
    "| database | wall | faults | acknowledged writes | lost | duplicates | attempts left running | run | "
    "held-out reward |\n|---|---:|---:|---|---:|---:|---:|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.interval, args.steps, args.batch, args.n_val = "8,20", 6, 4, 8
    if args.minutes is None:
        args.minutes = 3.0 if args.quick else 30.0
    folder = Path(args.out or f"runs/chaos/{args.backend}{'-quick' if args.quick else ''}").resolve()
    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"{folder} is not empty: pass --out with a new folder (a run's state must start fresh).")
    folder.mkdir(parents=True, exist_ok=True)
    warm = Path(args.warm_start)
    if not args.quick and not (warm / "config.json").exists():
        print(f"  warm start -> {warm}", file=sys.stderr, flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        subprocess.run([sys.executable, "-c", WARM_START, str(warm)], check=True, env=env)
    result = asyncio.run(Chaos(args, folder).run())
    (folder / "chaos.json").write_text(json.dumps(result, indent=1, default=str))
    table, ok = report(result, args.quick)
    print(generated_line("chaos.py", argv, f"{os.cpu_count()} cores, Python {sys.version.split()[0]}"))
    print()
    print(HEADER)
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
