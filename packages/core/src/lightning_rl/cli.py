"""The ``lightning-rl`` command.

Each subsystem owns its subcommands in a private ``_cli`` module exposing ``register(subparsers)``;
those modules import nothing heavy at module level, so ``lightning-rl --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main", "build_parser"]

_COMMAND_MODULES = (
    "lightning_rl.store._cli",
    "lightning_rl.gateway._cli",
    "lightning_rl.runner._cli",
    "lightning_rl.trainer._cli",
    "lightning_rl.plugins._cli",
    "lightning_rl.dashboard._cli",
    "lightning_rl.export._cli",
)


def _version() -> str:
    """The installed distribution's version (what pip installed), else the package's own."""
    from importlib import metadata

    try:
        return metadata.version("lightning-rl")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        from lightning_rl import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lightning-rl", description="Train any AI agent with reinforcement learning.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that subsystem is not part of this install
                continue
            raise
        register: Callable[[Any], None] = module.register
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from lightning_rl.memory import bound_kernel_cache

    bound_kernel_cache()  # before any command imports torch (lightning_rl.memory says why)
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int | None] = args.handler
    try:
        return handler(args) or 0
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped (exit 0); anything else was interrupted
        return 0 if args.command in ("gateway", "store") else 130
    except (ImportError, ValueError, PermissionError, OSError) as exc:
        print(f"lightning-rl: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
