"""Supervised warm start on chat demonstrations: the step before RL for a model that knows nothing.

A tiny model (or any model new to an agent's format) gets no reward at all, so GRPO has no signal.
Examples fix that with a short supervised pass on demonstrations written in exactly the messages
the agent's framework sends; rendering them with the serving engine's own chat template (tools
included) is what keeps the trained format identical to what the gateway will see in training.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ChatDemo", "WarmStart", "sft_on_chats", "canonical_completion"]

ChatDemo = tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]] | None, str]
"""``(messages, tools, completion)``: the request the framework sends and the assistant text to learn
(tool calls written in the model's own tool-call syntax)."""


@dataclass(frozen=True)
class WarmStart:
    """Where the fine-tuned model went and how the pass went."""

    model_dir: Path
    losses: list[float]
    n_examples: int


def canonical_completion(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, completion: str
) -> str:
    """``completion`` written exactly as the model's chat template renders that assistant turn back.

    A demonstration's tool call is usually written in one syntax (``<tool_call>{...}</tool_call>``)
    while a model's template renders calls in its own (SmolLM2: a JSON list over three lines). Both
    parse to the same call, but a model fine-tuned on the first writes calls that the next prompt
    renders differently, so the previous prompt plus the sampled response is then no prefix of the next
    prompt. Anything that splices a conversation's turns into one sequence needs that prefix
    (``lightning_rl.sequences``). Text without a tool call, or a template that does not render the
    turn after the request's own rendering, is returned unchanged.
    """
    from lightning_rl.engine.toolcalls import parse_tool_calls

    parsed = parse_tool_calls(completion)
    if parsed.parse_error is not None or not parsed.tool_calls:
        return completion
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
        for i, c in enumerate(parsed.tool_calls)
    ]
    turn = {"role": "assistant", "content": parsed.content or "", "tool_calls": calls}
    history = [dict(m) for m in messages]
    options: dict[str, Any] = {"tools": [dict(t) for t in tools] if tools else None, "tokenize": False}
    head = str(tokenizer.apply_chat_template(history, add_generation_prompt=True, **options))
    full = str(tokenizer.apply_chat_template([*history, turn], add_generation_prompt=False, **options))
    end = str(tokenizer.eos_token or "")
    if not full.startswith(head) or not end or end not in full[len(head) :]:
        return completion
    return full[len(head) :].split(end, 1)[0]


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
    lora_rank: int = 0,
    dtype: str = "float32",
    shared_prefix: int = 0,
    micro_batch_tokens: int = 16_384,
    canonical: bool = False,
) -> WarmStart:
    """Fine-tune ``model_dir`` for ``steps`` steps on ``demos``; save an HF folder at ``out_dir``.

    The learning rate warms up over ``warmup_steps`` (default ``min(20, steps)``), then decays
    (cosine) to ``final_lr_fraction`` of ``lr`` (1.0 keeps it constant). ``lora_rank > 0`` trains
    LoRA adapters of that rank (alpha ``2 * rank``) and merges them into the saved folder, in
    float32; ``dtype``, ``shared_prefix`` and ``micro_batch_tokens`` are the backend's
    (``TorchBackendConfig``). ``canonical`` rewrites each completion's tool calls as the model's
    chat template renders them back (``canonical_completion``).

    Raises:
        ValueError: ``demos`` is empty.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.engine.hf import ChatPrompts

    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)  # prompts need the tokenizer, not a model copy
    prompts = ChatPrompts(tokenizer)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def text(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, done: str) -> str:
        return canonical_completion(tokenizer, messages, tools, done) if canonical else done

    examples = [
        (
            prompts.encode(messages, tools or None),
            [*tokenizer.encode(text(messages, tools, completion), add_special_tokens=False), eos],
        )
        for messages, tools, completion in demos
    ]
    if not examples:
        raise ValueError("sft_on_chats needs at least one example; demos is empty.")
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    backend = TorchBackend(
        model,
        TorchBackendConfig(
            lr=lr,
            seed=seed,
            track_kl=False,
            lora_rank=lora_rank,
            lora_alpha=2 * lora_rank if lora_rank else 16,
            dtype=dtype,
            shared_prefix=shared_prefix,
            micro_batch_tokens=micro_batch_tokens,
        ),
    )
    warmup = min(20, steps) if warmup_steps is None else warmup_steps
    losses = backend.sft(
        examples, steps=steps, batch_size=batch_size, warmup_steps=warmup, final_lr_fraction=final_lr_fraction
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    adapted: Any = backend.model  # a peft wrapper under LoRA: merged in float32, as the staged warm start does
    (adapted.float().merge_and_unload() if lora_rank else model.float()).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return WarmStart(out_dir, losses, len(examples))
