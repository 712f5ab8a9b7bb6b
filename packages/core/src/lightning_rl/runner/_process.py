"""Worker processes behind ``lightning-rl runner``: one worker, or a supervisor of several.

A worker process opens the store, runs a ``Runner`` until told to stop, and prints its counters as
one JSON line on stdout. With ``--workers P`` the command becomes a supervisor: it starts P worker
processes (each in its own session, so a terminal Ctrl-C reaches only the supervisor, which then
stops them in order), restarts a worker that dies (with a growing delay if it keeps dying), and
exits when all have stopped. A worker notices when its supervisor disappears and stops too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning_rl.agent import AgentFn

__all__ = ["main"]

_log = logging.getLogger("lightning_rl.runner")

_FORCED_EXIT_GRACE_S = 1.0
"""After a second SIGINT/SIGTERM, how long the worker may take to cancel its rollouts before it is
ended with ``os._exit`` (an agent blocking the loop would otherwise keep it alive)."""


def _store_token(args: argparse.Namespace) -> str | None:
    from lightning_rl.credentials import DEPRECATED_STORE_TOKEN_ENVS, STORE_TOKEN_ENV, resolve_token

    return resolve_token(
        STORE_TOKEN_ENV, flag=args.token, flag_file=args.token_file, deprecated_envs=DEPRECATED_STORE_TOKEN_ENVS
    )


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.concurrency < 1 or args.workers < 1:
        raise ValueError("--concurrency and --workers must be at least 1.")
    if args.store in ("memory", "memory://"):
        raise ValueError(
            "--store memory:// would be private to the runner process; use a SQLite file, PostgreSQL or a store server."
        )
    if args.workers > 1:
        return _supervise(args)
    return _run_worker(args)


# --------------------------------------------------------------------------------------------
# One worker
# --------------------------------------------------------------------------------------------


def _run_worker(args: argparse.Namespace) -> int:
    from lightning_rl.agent import load_agent

    agent = load_agent(args.agent)  # fail before touching the store if the agent cannot load
    if args.otel:
        from lightning_rl.tracing.otel import configure_opentelemetry

        configure_opentelemetry()
    if getattr(args, "capture", None):
        from lightning_rl.capture import capture

        capture(args.capture)
    return asyncio.run(_worker(args, agent))


async def _worker(args: argparse.Namespace, agent: AgentFn) -> int:
    from lightning_rl.runner.worker import Runner
    from lightning_rl.store import open_store

    store = await open_store(args.store, token=_store_token(args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()

    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        # A plain signal handler, not loop.add_signal_handler: it runs even while an agent blocks
        # the event loop, so a second Ctrl-C always ends the process as documented. (It counts the
        # signals itself: a blocked loop has not run the first one's stop.set yet.)
        name = signal.Signals(signum).name
        received.append(signum)
        if len(received) > 1 or stop.is_set():
            _log.warning("second %s: stopping now; running attempts will be timed out by the store", name)
            if main_task is not None:
                loop.call_soon_threadsafe(main_task.cancel)
            _exit_later(130, _FORCED_EXIT_GRACE_S)
            return
        _log.info("%s: finishing running rollouts, claiming no more", name)
        loop.call_soon_threadsafe(stop.set)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    watcher = asyncio.create_task(_watch_supervisor(args.supervisor_pid, stop)) if args.supervisor_pid else None
    runner = Runner(
        store,
        agent,
        worker_id=args.worker_id,
        concurrency=args.concurrency,
        poll_interval_s=args.poll_interval,
        heartbeat_interval_s=args.heartbeat_interval,
        default_timeout_s=args.timeout,
        block_timeout_s=args.block_timeout or None,
        redact_errors=args.redact_errors,
    )
    code = 0
    try:
        await runner.run(stop, until_idle=args.until_idle)
    except asyncio.CancelledError:
        code = 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watcher is not None:
            watcher.cancel()
        with contextlib.suppress(Exception):
            await store.close()
    print(json.dumps({"worker_id": runner.worker_id, **runner.stats.as_dict()}), flush=True)
    return code


def _exit_later(code: int, after_s: float) -> None:
    """End the process with ``code`` after ``after_s`` unless it has exited by then."""

    def later() -> None:
        time.sleep(after_s)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    threading.Thread(target=later, name="lightning-runner-exit", daemon=True).start()


async def _watch_supervisor(supervisor_pid: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        if os.getppid() != supervisor_pid:
            _log.warning("supervisor %d is gone; stopping this worker", supervisor_pid)
            stop.set()
            return
        await asyncio.sleep(1.0)


# --------------------------------------------------------------------------------------------
# Supervisor of several workers
# --------------------------------------------------------------------------------------------


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen[bytes]
    started_at: float
    restarts: int = 0
    delay_s: float = 1.0
    restart_at: float | None = None


def _child_argv(args: argparse.Namespace, index: int) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "lightning_rl.cli",
        "runner",
        "--store",
        args.store,
        "--agent",
        args.agent,
        "--concurrency",
        str(args.concurrency),
        "--workers",
        "1",
        "--poll-interval",
        str(args.poll_interval),
        "--heartbeat-interval",
        str(args.heartbeat_interval),
        "--log-level",
        args.log_level,
        "--supervisor-pid",
        str(os.getpid()),
    ]
    if args.worker_id:
        argv += ["--worker-id", f"{args.worker_id}-{index}"]
    if args.timeout is not None:
        argv += ["--timeout", str(args.timeout)]
    if args.until_idle:
        argv.append("--until-idle")
    if args.redact_errors:
        argv.append("--redact-errors")
    argv += ["--block-timeout", str(args.block_timeout)]
    if args.otel:
        argv.append("--otel")
    if getattr(args, "capture", None):
        argv += ["--capture", args.capture]
    return argv


def _spawn(args: argparse.Namespace, index: int) -> subprocess.Popen[bytes]:
    from lightning_rl.credentials import STORE_TOKEN_ENV

    env = dict(os.environ)
    token = _store_token(args)
    if token:
        env[STORE_TOKEN_ENV] = token  # through the environment, not argv: argv is visible to every local user
    return subprocess.Popen(_child_argv(args, index), env=env, start_new_session=True)


def _supervise(args: argparse.Namespace) -> int:
    stopping = {"count": 0}
    children: dict[int, _Child] = {}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["count"] += 1
        sig = signal.SIGTERM if stopping["count"] == 1 else signal.SIGKILL
        _log.info("%s: sending %s to %d worker(s)", signal.Signals(signum).name, sig.name, len(children))
        for child in children.values():
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(sig)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    restarts = 0
    try:
        for i in range(args.workers):
            children[i] = _Child(i, _spawn(args, i), time.monotonic())
        while children:
            time.sleep(0.2)
            for i, child in list(children.items()):
                code = child.proc.poll()
                if code is None:
                    continue
                if stopping["count"] or (code == 0 and args.until_idle):
                    del children[i]
                elif child.restart_at is None:
                    # A worker that keeps dying right after it starts is backed off, up to 30 s between tries.
                    quick = time.monotonic() - child.started_at < 10.0
                    child.delay_s = min(child.delay_s * 2, 30.0) if quick else 1.0
                    child.restart_at = time.monotonic() + child.delay_s
                    _log.warning("worker %d exited with code %s; restarting it in %.0f s", i, code, child.delay_s)
                elif time.monotonic() >= child.restart_at:
                    child.proc = _spawn(args, i)
                    child.started_at = time.monotonic()
                    child.restart_at = None
                    child.restarts += 1
                    restarts += 1
        _log.info("all workers stopped (%d restart(s))", restarts)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
