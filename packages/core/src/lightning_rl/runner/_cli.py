"""``lightning-rl runner``: run an agent on rollouts from a store, in one or more worker processes.

Imports nothing heavy: the worker code loads only when the command runs.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``runner`` subcommand to the ``lightning-rl`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "runner",
        help="run an agent on rollouts claimed from a store",
        description=(
            "Claim rollouts from a store and run AGENT on them. Each worker process runs up to "
            "--concurrency rollouts at once (async agents as tasks, sync agents in threads); "
            "--workers starts several processes and restarts any that crash. SIGTERM or Ctrl-C "
            "stops claiming and lets running rollouts finish; a second one stops at once."
        ),
    )
    parser.add_argument(
        "--store",
        required=True,
        help="store: a SQLite file path or sqlite:///path, postgresql://..., or http(s)://host:port of a server",
    )
    parser.add_argument("--agent", required=True, help="the agent function as package.module:function")
    parser.add_argument("--concurrency", type=int, default=4, help="rollouts run at once per worker (default 4)")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument(
        "--token-file",
        default=None,
        help="file holding the bearer token of an HTTP store (default: $LIGHTNING_STORE_TOKEN_FILE, "
        "else $LIGHTNING_STORE_TOKEN; the old $LIGHTNING_TOKEN still works)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="the store's bearer token itself (visible in the process list: prefer --token-file or the variable)",
    )
    parser.add_argument(
        "--redact-errors",
        action="store_true",
        help="replace what looks like keys, tokens or passwords in agent errors before storing them",
    )
    parser.add_argument(
        "--block-timeout",
        type=float,
        default=30.0,
        help="seconds an async agent may block the event loop (e.g. time.sleep) before the watchdog interrupts it "
        "with an error naming it; 0 disables the watchdog (default 30)",
    )
    parser.add_argument("--worker-id", default=None, help="worker name in the store (default host-pid-xxxx)")
    parser.add_argument("--poll-interval", type=float, default=0.5, help="seconds between claims when idle")
    parser.add_argument("--heartbeat-interval", type=float, default=5.0, help="longest seconds between heartbeats")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="timeout in seconds for rollouts whose config sets none; sent with each claim, so the store enforces "
        "it even if this worker dies",
    )
    parser.add_argument("--until-idle", action="store_true", help="exit once the queue is empty and nothing runs")
    parser.add_argument(
        "--otel", action="store_true", help="export OpenTelemetry spans of the agent (needs opentelemetry-sdk)"
    )
    parser.add_argument(
        "--capture",
        choices=["openllmetry", "openinference"],
        default=None,
        help="record the agent's model calls with this OpenTelemetry instrumentation family (any OpenAI-compatible "
        "endpoint, text-level transitions; needs lightning-rl[capture]; see docs/capture.md)",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--supervisor-pid", type=int, default=None, help=argparse.SUPPRESS)
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from lightning_rl.runner._process import main

    return main(args)
