"""Test doubles shipped with the core, for testing the layers above them (and for users' tests).

Everything here is a fake, named as one: ``FakeUpstream`` is a scripted stand-in for a vLLM server;
``GatewayHarness`` runs the real store and gateway in front of it, for plugin tests; ``FakeJudge`` is a
scripted LLM judge for ``lightning_rl.rewards``; ``FakeFineTuningServer`` is a scripted hosted fine-tuning
API (``/v1/fine_tuning/jobs``) on a real local HTTP server, for ``lightning_rl.export.HostedSFT``.
Exports are lazy so importing this package costs nothing until a double is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_rl.testing.fake_finetune import FAKE_API_KEY, FakeFineTuningServer, FakeJobOutcome
    from lightning_rl.testing.fake_judge import FakeJudge
    from lightning_rl.testing.fake_upstream import (
        FakeReply,
        FakeToolCall,
        FakeUpstream,
        fake_token_ids,
        fast_upstream_app,
    )
    from lightning_rl.testing.harness import GatewayHarness

__all__ = [
    "FakeReply",
    "FakeToolCall",
    "FakeUpstream",
    "fake_token_ids",
    "fast_upstream_app",
    "GatewayHarness",
    "FakeJudge",
    "FakeFineTuningServer",
    "FakeJobOutcome",
    "FAKE_API_KEY",
]

_FINETUNE = ("FakeFineTuningServer", "FakeJobOutcome", "FAKE_API_KEY")


def __getattr__(name: str) -> Any:
    if name == "GatewayHarness":
        return importlib.import_module("lightning_rl.testing.harness").GatewayHarness
    if name in _FINETUNE:
        return getattr(importlib.import_module("lightning_rl.testing.fake_finetune"), name)
    if name == "FakeJudge":
        return importlib.import_module("lightning_rl.testing.fake_judge").FakeJudge
    if name in __all__:
        return getattr(importlib.import_module("lightning_rl.testing.fake_upstream"), name)
    raise AttributeError(f"module 'lightning_rl.testing' has no attribute {name!r}")
