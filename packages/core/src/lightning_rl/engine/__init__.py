"""Inference engines the gateway serves from, and the tiny-model kit.

``import lightning_rl.engine`` stays light (no torch, no transformers): the contract, the tool-call
parser and the kit's config import eagerly; ``TransformersEngine`` loads torch on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_rl.engine.base import (
    GenerationOutput,
    InferenceEngine,
    ParsedMessage,
    ParsedToolCall,
    SamplingParams,
    StreamDelta,
)
from lightning_rl.engine.logprobs import sampled_logprobs, sampling_logprobs
from lightning_rl.engine.models import SHORT_NAMES, resolve_model, served_model_name
from lightning_rl.engine.tiny import TinyModelConfig, build_tiny_model, default_tiny_model
from lightning_rl.engine.toolcalls import new_tool_call_id, parse_tool_calls

if TYPE_CHECKING:
    from lightning_rl.engine.hf import EngineStats, TransformersEngine

__all__ = [
    # the contract
    "InferenceEngine",
    "SamplingParams",
    "GenerationOutput",
    "StreamDelta",
    "ParsedMessage",
    "ParsedToolCall",
    # the embedded engine (imports torch on first access)
    "TransformersEngine",
    "EngineStats",
    # the sampling distribution shared with the trainer
    "sampling_logprobs",
    "sampled_logprobs",
    # tool calls
    "parse_tool_calls",
    "new_tool_call_id",
    # model names: tiny, smollm2-135m, .gguf files, HF folders and Hub ids
    "resolve_model",
    "served_model_name",
    "SHORT_NAMES",
    # the tiny-model kit
    "TinyModelConfig",
    "build_tiny_model",
    "default_tiny_model",
]

_LAZY = {"TransformersEngine": "lightning_rl.engine.hf", "EngineStats": "lightning_rl.engine.hf"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lightning_rl.engine' has no attribute {name!r}")
