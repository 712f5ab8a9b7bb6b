"""Where ``TorchBackend.publish()`` sends new weights.

In process, the trainer hands the state dict straight to the engine (``engine_publisher``). When
the gateway runs as a separate process on the same machine (or a shared filesystem), the weights
are saved with ``torch.save`` into the gateway's weights folder (its ``--weights-dir``) and the
gateway is told to load them through its ``POST /admin/weights`` endpoint, which takes the
gateway's admin token (``gateway_publisher``); only the latest file is kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from lightning_rl.backends.torch_backend import Publisher
from lightning_rl.engine.base import InferenceEngine

__all__ = ["engine_publisher", "gateway_publisher"]


def engine_publisher(engine: InferenceEngine) -> Publisher:
    """Publish into an engine in this process (an atomic swap between batches)."""

    async def publish(state: Mapping[str, torch.Tensor], version: int) -> None:
        await engine.load_weights(state, version)

    return publish


def gateway_publisher(
    url: str, directory: str | Path, *, token: str | None = None, timeout_s: float = 300.0
) -> Publisher:
    """Publish to a gateway process at ``url`` through ``POST /admin/weights``.

    ``directory`` must be the gateway's weights folder (``--weights-dir``), readable by the gateway
    process at the same path; ``token`` is the gateway's admin token (not the agents' key). Raises
    ``PermissionError`` on a wrong token or a folder the gateway refuses, and ``ConnectionError``
    when the gateway cannot load them.
    """
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)

    async def publish(state: Mapping[str, torch.Tensor], version: int) -> None:
        import httpx

        path = folder / f"weights-v{version}.pt"
        await asyncio.to_thread(torch.save, dict(state), path)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            response = await client.post(
                f"{url.rstrip('/')}/admin/weights",
                json={"path": str(path.resolve()), "version": version},
                headers=headers,
            )
        if response.status_code in (401, 403):
            raise PermissionError(
                f"the gateway at {url} refused the weights: {response.text}; pass its admin token and save into its "
                "--weights-dir."
            )
        if response.status_code != 200:
            detail: Any = response.text
            raise ConnectionError(f"the gateway at {url} could not load {path}: HTTP {response.status_code} {detail}")
        for old in folder.glob("weights-v*.pt"):
            if old != path:
                old.unlink(missing_ok=True)

    return publish
