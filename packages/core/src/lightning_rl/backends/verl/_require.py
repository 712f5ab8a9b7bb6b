"""The one place that imports ``verl`` and explains what to install when it is missing.

``verl`` pulls in Ray, tensordict and omegaconf and pins ``transformers<5.11``; it is an optional
extra so the core (and every agent-side runner) never pays for it. Every module of this
subpackage calls ``require_verl()`` before importing anything from VeRL.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["INSTALL_HINT", "SUPPORTED", "PYTHON_LIMIT", "require_verl"]

PYTHON_LIMIT = (3, 13)
"""verl 0.9 declares ``Requires-Python <3.13``, so the ``verl`` extra installs no verl from 3.13 on
(its requirement carries a ``python_version`` marker: pip resolves, but silently without verl)."""

SUPPORTED = ">=0.9.1,<0.10"
"""The VeRL versions this backend is written against (read from verl 0.9.1's source)."""

INSTALL_HINT = (
    "the VeRL backend needs verl 0.9.x and its trainer dependencies: "
    "pip install 'lightning-rl[verl]' (or: pip install 'verl==0.9.1' cachetools uvicorn fastapi pyzmq msgspec)"
)


def require_verl() -> ModuleType:
    """Import and return ``verl``; raise ``ImportError`` naming the install command when it is missing."""
    try:
        import verl  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        if sys.version_info >= PYTHON_LIMIT:
            here = ".".join(map(str, sys.version_info[:3]))
            raise ImportError(
                f"the VeRL backend needs verl, which supports Python < 3.13 only (this is Python {here}, where "
                "the 'verl' extra installs no verl): use a Python 3.11 or 3.12 environment, e.g. "
                "uv venv -p 3.12 && pip install 'lightning-rl[verl]'"
            ) from exc
        raise ImportError(INSTALL_HINT) from exc
    return verl
