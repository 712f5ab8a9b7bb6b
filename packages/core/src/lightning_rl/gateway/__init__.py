"""The OpenAI-compatible gateway that serves a model to agents and records exact tokens per rollout.

``create_gateway_app(backend, store=...)`` builds the FastAPI app; ``running_gateway(app)`` serves it
in the current event loop; ``lightning-rl gateway serve`` runs it as a process. Exports are lazy so
``import lightning_rl.gateway`` (and the CLI's ``--help``) does not import FastAPI, httpx or torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_rl.gateway.adapters import RoleAdaptersBackend
    from lightning_rl.gateway.app import GatewayConfig, create_gateway_app
    from lightning_rl.gateway.frozen import FrozenRolesBackend
    from lightning_rl.gateway.recording import CallContext, build_llm_spans
    from lightning_rl.gateway.server import running_gateway, uvicorn_config
    from lightning_rl.gateway.upstreams import (
        CallResult,
        CallSpec,
        ChoiceResult,
        EngineBackend,
        GatewayBackend,
        StreamPiece,
        UpstreamBackend,
    )

__all__ = [
    # app
    "create_gateway_app",
    "GatewayConfig",
    "running_gateway",
    "uvicorn_config",
    # upstreams: what serves the model calls (not the training backends of lightning_rl.backends)
    "GatewayBackend",
    "EngineBackend",
    "UpstreamBackend",
    "CallSpec",
    "CallResult",
    "ChoiceResult",
    "StreamPiece",
    "FrozenRolesBackend",
    "RoleAdaptersBackend",
    # recording
    "CallContext",
    "build_llm_spans",
]

_WHERE = {  # name -> its module
    name: module
    for module, names in {
        "app": "create_gateway_app GatewayConfig",
        "server": "running_gateway uvicorn_config",
        "upstreams": "GatewayBackend EngineBackend UpstreamBackend CallSpec CallResult ChoiceResult StreamPiece",
        "frozen": "FrozenRolesBackend",
        "adapters": "RoleAdaptersBackend",
        "recording": "CallContext build_llm_spans",
    }.items()
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_rl.gateway' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lightning_rl.gateway.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
