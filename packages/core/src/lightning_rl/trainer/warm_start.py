"""Supervised warm start on chat demonstrations: the step before RL for a model that knows nothing.

A tiny model (or any model new to an agent's format) gets no reward at all, so GRPO has no signal.
Examples fix that with a short supervised pass on demonstrations written in exactly the messages
the agent's framework sends; rendering them with the serving engine's own chat template (tools
included) is what keeps the trained format identical to what the gateway will see in training.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChatDemo", "WarmStart", "sft_on_chats"]

ChatDemo = tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None, str]
"""``(messages, tools, completion)``: the request the framework sends and the assistant text to learn
(tool calls written in the model's own tool-call syntax)."""


@dataclass(frozen=True)
class WarmStart:
    """Where the fine-tuned model went and how the pass went."""

    model_dir: Path
    losses: list[float]
    n_examples: int


def sft_on_chats(
    model_dir: Path,
    out_dir: Path,
    demos: Iterable[ChatDemo],
    *,
    steps: int,
    seed: int = 0,
    lr: float = 3e-3,
    batch_size: int = 8,
    warmup_steps: int | None = None,
    final_lr_fraction: float = 0.1,
) -> WarmStart:
    """Fine-tune ``model_dir`` for ``steps`` steps on ``demos``; save an HF folder at ``out_dir``.

    The learning rate warms up over ``warmup_steps`` (default ``min(20, steps)``), then decays
    (cosine) to ``final_lr_fraction`` of ``lr`` (1.0 keeps it constant).

    Raises:
        ValueError: ``demos`` is empty.
    """
    from transformers import AutoModelForCausalLM

    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.engine.hf import TransformersEngine

    engine = TransformersEngine.from_pretrained(model_dir)
    try:
        eos = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
        examples = [
            (
                engine.encode_chat(messages, tools or None),
                [*engine.tokenizer.encode(completion, add_special_tokens=False), eos],
            )
            for messages, tools, completion in demos
        ]
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
        backend = TorchBackend(model, TorchBackendConfig(lr=lr, seed=seed))
        warmup = min(20, steps) if warmup_steps is None else warmup_steps
        losses = backend.sft(
            examples, steps=steps, batch_size=batch_size, warmup_steps=warmup, final_lr_fraction=final_lr_fraction
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        engine.tokenizer.save_pretrained(out_dir)
    finally:
        engine.close()
    return WarmStart(out_dir, losses, len(examples))
