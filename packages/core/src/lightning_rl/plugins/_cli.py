"""``lightning-rl plugins``: which framework plugins are installed, and whether their framework fits."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from lightning_rl.plugins.registry import describe_plugins

    infos = describe_plugins()
    if not infos:
        print("no Lightning plugins installed; e.g. pip install lightning-langchain")
        return 0
    for info in infos:
        state = "ok" if info.ok else ("missing" if info.installed is None else "unsupported version")
        print(f"{info.name:16} {info.framework}{info.supported:14} installed: {info.installed or '-':10} {state}")
    return 0 if all(i.ok for i in infos) else 1


def register(sub: Any) -> None:
    parser = sub.add_parser("plugins", help="list installed framework plugins and check their framework versions")
    parser.set_defaults(handler=_run)
