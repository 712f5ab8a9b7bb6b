"""Capture model calls from the agent's side with the standard OpenTelemetry instrumentations.

The gateway records a call exactly (token ids, logprobs) but only when the model sits behind its
URL. An agent whose model is a hosted API can still be optimised: ``capture()`` turns on
OpenLLMetry's or OpenInference's instrumentations for rollouts, their spans reach the store
through the ``LightningSpanProcessor``, and the adapter builds text-level transitions from them
(``Transition.text``; ``exact_tokens`` False). SFT and APO use the text as it is; RL first calls
:func:`retokenize` with the policy's tokenizer. See ``docs/capture.md``.

Import what you need from here (``from lightning_rl.capture import retokenize``); the
``lightning_rl.capture`` attribute of the top-level package is the ``capture`` function itself.
Nothing here imports OpenTelemetry until ``capture()`` runs.
"""

from __future__ import annotations

from lightning_rl.capture._convert import (
    CapturedCall,
    CapturedTool,
    Source,
    call_spans,
    capture_source,
    captured_calls,
    captured_tools,
    normalize_messages,
    normalize_tool_calls,
)
from lightning_rl.capture._install import FRAMEWORKS, Capture, Family, capture
from lightning_rl.capture._retokenize import retokenize, retokenize_samples, template_message

__all__ = [
    "capture",
    "Capture",
    "Family",
    "FRAMEWORKS",
    "retokenize",
    "retokenize_samples",
    "template_message",
    "CapturedCall",
    "CapturedTool",
    "Source",
    "call_spans",
    "capture_source",
    "captured_calls",
    "captured_tools",
    "normalize_messages",
    "normalize_tool_calls",
]
