"""The processes of ``chaos.py``'s deployment: a database server, the store server, runners, a trainer.

Each is a ``Component`` the chaos loop can kill (SIGKILL), pause (SIGSTOP, later SIGCONT) and start
again, and the supervisor restarts when it exits on its own (as systemd or Kubernetes would). The
database servers are private instances on free ports in the run folder, never the machine's shared
PostgreSQL or Redis: killing those would break whatever else uses them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = [
    "Component",
    "PostgresServer",
    "RedisServer",
    "StoreServer",
    "Runner",
    "TrainerProc",
    "free_port",
    "TRAINER_SCRIPT",
]

TRAINER_SCRIPT = r'''
"""The demo's RL phase against the store server, logging exactly which rollouts each update used."""
import json, os, sys
from lightning_rl.demo.calculator import make_tasks
from lightning_rl.demo.run import DemoConfig, demo_trainer_config
from lightning_rl.trainer import Trainer

model, run_dir, store, steps, n_val, batch = sys.argv[1:7]
steps, n_val, batch = int(steps), int(n_val), int(batch)
updates = open(os.path.join(run_dir, "updates.jsonl"), "a")


class LoggingTrainer(Trainer):
    async def _wait(self, svc, ids):
        finished = await super()._wait(svc, ids)
        row = {"run_id": svc.run_id, "ids": [r.id for r in finished], "status": [r.status.value for r in finished]}
        updates.write(json.dumps(row) + "\n")
        updates.flush()
        os.fsync(updates.fileno())
        return finished


cfg = DemoConfig(seed=0, steps=steps, batch_size=batch, n_val=n_val, progress=False, val_every=0)
tasks = make_tasks(cfg.n_train + cfg.n_val + cfg.n_probe, seed=cfg.seed)
config = demo_trainer_config(
    model, run_dir, cfg, store=store, concurrency=0, engine_batch_size=64, checkpoint_every=2, resume=True,
    heartbeat_timeout_s=10.0, max_attempts=3, rollout_timeout_s=120.0, step_timeout_s=600.0, tensorboard=False,
)
result = LoggingTrainer(config).fit(None, tasks[: cfg.n_train], tasks[cfg.n_train : cfg.n_train + cfg.n_val])
print(json.dumps({"val_before": result.val_before, "val_after": result.val_after}), flush=True)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc), so a kill reaches a server's worker processes too."""
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                out.append(int(child))
                out.extend(_children(int(child)))
    except OSError:
        pass
    return out


class Component:
    """One process (and its descendants) the chaos loop may kill, pause and start again."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.starts = 0
        self.unexpected_exits: list[int] = []

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_STORE")}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.folder), os.environ.get("PYTHONPATH")) if p)
        return env

    def start(self) -> None:
        log = (self.folder / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            self.command(), env=self.env(), stdout=self.stdout(), stderr=log, start_new_session=True
        )
        log.close()
        self.paused = False
        self.starts += 1

    def stdout(self) -> int | None:
        return subprocess.DEVNULL

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal_all(self, sig: int) -> None:
        if self.proc is None:
            return
        for pid in [self.proc.pid, *_children(self.proc.pid)]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL the process and everything it started (no chance to flush or say goodbye)."""
        if self.paused:
            self._signal_all(signal.SIGCONT)
        self._signal_all(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        self._signal_all(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        """A polite stop at the end of the run (SIGTERM, then SIGKILL after 20 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.paused:
            self.resume()
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.kill()

    def ready(self) -> bool:
        """Whether a freshly started process answers (checked before the chaos starts)."""
        return self.alive()


def _as_postgres_user(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to the ``postgres`` user (setpriv execs, so the pid we
    hold is the server's own)."""
    if os.geteuid() != 0:
        return cmd
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", *cmd]


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not versions:
        raise FileNotFoundError(f"{name} not found: install PostgreSQL (apt-get install postgresql).")
    return str(versions[-1] / name)


class PostgresServer(Component):
    """A private PostgreSQL cluster (initdb in the run folder, trust auth, loopback only)."""

    def __init__(self, folder: Path) -> None:
        super().__init__("postgres", folder)
        self.port = free_port()
        # The cluster lives in a folder of its own under the system's temp dir: run as root, the
        # server drops to the postgres user, who may not be able to reach the run folder (mktemp -d).
        self.home = Path(tempfile.mkdtemp(prefix="lightning-chaos-pg-"))
        self.home.chmod(0o755)
        self.data = self.home / "pgdata"
        self.sockets = self.home / "pgsock"
        if not self.data.exists():
            self.data.mkdir(parents=True)
            self.sockets.mkdir(exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.data, "postgres", "postgres")
                shutil.chown(self.sockets, "postgres", "postgres")
            subprocess.run(
                _as_postgres_user([_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres"]),
                check=True,
                stdout=subprocess.DEVNULL,
            )

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def command(self) -> list[str]:
        return _as_postgres_user(
            [
                _pg_bin("postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-k",
                str(self.sockets),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
            ]
        )

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def remove(self) -> None:
        """Delete the cluster (after the final stop; a clean restart only stops it)."""
        shutil.rmtree(self.home, ignore_errors=True)


class RedisServer(Component):
    """A private redis-server with the append-only file on (``appendfsync`` as asked)."""

    def __init__(self, folder: Path, appendfsync: str) -> None:
        super().__init__("redis", folder)
        self.port = free_port()
        self.appendfsync = appendfsync
        self.data = folder / "redisdata"
        self.data.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            shutil.which("redis-server") or "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
        ]

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lightning_rl.cli", *args]


class StoreServer(Component):
    """``lightning-rl store serve`` on the database (restarted on the same port)."""

    def __init__(self, folder: Path, backend: str, where: str) -> None:
        super().__init__("store", folder)
        self.port = free_port()
        self.backend = backend
        self.where = where

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        flag = "--dsn" if self.backend == "postgres" else "--redis-url"
        return _cli("store", "serve", "--backend", self.backend, flag, self.where, "--port", str(self.port))

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return b" 200 " in s.recv(64)
        except OSError:
            return False


class Runner(Component):
    """``lightning-rl runner`` running the demo's unchanged calculator agent."""

    def __init__(self, folder: Path, index: int, store_url: str, concurrency: int) -> None:
        super().__init__(f"runner{index}", folder)
        self.store_url = store_url
        self.concurrency = concurrency

    def command(self) -> list[str]:
        return _cli(
            "runner",
            "--store",
            self.store_url,
            "--agent",
            "lightning_rl.demo.calculator:calculator_agent",
            "--concurrency",
            str(self.concurrency),
            "--poll-interval",
            "0.2",
            "--heartbeat-interval",
            "2",
            "--log-level",
            "WARNING",
        )


class TrainerProc(Component):
    """The demo's RL phase (``TRAINER_SCRIPT``), always started with ``resume``."""

    def __init__(self, folder: Path, model: str, store_url: str, steps: int, n_val: int, batch: int) -> None:
        super().__init__("trainer", folder)
        self.model = model
        self.store_url = store_url
        self.steps = steps
        self.n_val = n_val
        self.batch = batch
        self.run_dir = folder / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (folder / "chaos_trainer.py").write_text(TRAINER_SCRIPT)

    def command(self) -> list[str]:
        script = str(self.folder / "chaos_trainer.py")
        args = [self.model, str(self.run_dir), self.store_url, str(self.steps), str(self.n_val), str(self.batch)]
        return [sys.executable, script, *args]

    def env(self) -> dict[str, str]:
        env = super().env()
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def stdout(self) -> int | None:
        return subprocess.PIPE

    def checkpoint_dirs(self) -> set[str]:
        folder = self.run_dir / "checkpoints"
        return {p.name for p in folder.glob("step_*")} if folder.exists() else set()

    def metrics_rows(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return sum(1 for _ in path.open()) if path.exists() else 0

    def wait_checkpoint_started(self, timeout_s: float) -> bool:
        """Block until a new checkpoint folder appears (the save is under way), or ``timeout_s``."""
        before = self.checkpoint_dirs()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.alive():
            if self.checkpoint_dirs() - before:
                return True
            time.sleep(0.005)
        return False
