"""Token ids for text-level transitions, built with the policy's own tokenizer, for RL.

A call captured by OpenTelemetry (a hosted model) has text but no token ids, and its model's
tokenizer is not the policy's anyway. To train the policy on it, the conversation is rendered with
the policy tokenizer's chat template, as the Lightning engine renders a request: the prompt is the
template of the messages with the generation prompt, and the response is what the template adds
for the assistant message (its closing tokens included). The ids are then the policy's, not the
sampler's: ``exact_tokens`` stays False, ``response_logprobs`` stays None (use
``old_logprobs='recompute'``), and ``text.retokenized_with`` names the tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, cast

from lightning_rl.types import Transition

__all__ = ["retokenize", "retokenize_samples", "template_message"]


def template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A normalised message -> what HF chat templates expect (OpenAI tool calls, dict arguments)."""
    out: dict[str, Any] = {"role": message.get("role", "user"), "content": message.get("content") or ""}
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        rendered: list[dict[str, Any]] = []
        for raw in cast(list[Any], calls):
            call = cast(Mapping[str, Any], raw)
            arguments: Any = call.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    pass  # the template renders the string as it is
            function = {"name": call.get("name"), "arguments": arguments}
            rendered.append({"id": call.get("id"), "type": "function", "function": function})
        out["tool_calls"] = rendered
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


def _text_only(t: Transition) -> bool:
    """A captured call still without token ids (the gateway's calls keep the engine's ids, even none)."""
    return t.text is not None and t.text.source != "gateway" and not (t.prompt_ids and t.response_ids)


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, *, generation_prompt: bool) -> str:
    return cast(
        str,
        tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False),
    )


def retokenize(transitions: Iterable[Transition], tokenizer: Any, *, name: str | None = None) -> int:
    """Fill the token ids of text-level transitions (in place) with ``tokenizer``; return how many.

    Transitions that already have token ids, and the gateway's, are left alone. ``tokenizer`` is a
    Hugging Face tokenizer with a chat template (the policy's: ``engine.tokenizer``); ``name``
    is recorded in ``text.retokenized_with`` (default: the tokenizer's ``name_or_path``).

    Raises:
        ValueError: the tokenizer has no chat template, or the template cannot render a conversation.
    """
    todo = [t for t in transitions if _text_only(t)]
    if todo and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("retokenize needs a tokenizer with a chat template (the policy's tokenizer).")
    label = name or str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    done = 0
    for t in todo:
        assert t.text is not None
        messages = [template_message(m) for m in t.text.messages]
        reply = template_message({"role": "assistant", "content": t.text.response, "tool_calls": t.text.tool_calls})
        tools = t.text.tools or None
        try:
            prompt = _render(tokenizer, messages, tools, generation_prompt=True)
            full = _render(tokenizer, [*messages, reply], tools, generation_prompt=False)
        except Exception as exc:  # jinja2 errors: the conversation does not fit the template
            raise ValueError(f"transition {t.span_id}: the chat template could not render it: {exc}") from exc
        tail = full[len(prompt) :] if full.startswith(prompt) else t.text.response
        t.prompt_ids = list(tokenizer.encode(prompt, add_special_tokens=False))
        t.response_ids = list(tokenizer.encode(tail, add_special_tokens=False))
        t.response_logprobs = None
        t.exact_tokens = False
        t.text.retokenized_with = label
        done += 1
    return done


def retokenize_samples(samples: Iterable[Any], engine: Any) -> int:
    """``retokenize`` every text-level transition of the trainer's rollout samples with ``engine.tokenizer``.

    The trainer calls this after adapting a step's rollouts, so captured calls train like the
    gateway's (SFT and RL alike). Nothing to do (no captured call) costs nothing, whatever the engine.

    Raises:
        ValueError: captured calls are present but ``engine`` has no tokenizer (an engine outside
            this process, e.g. VeRL's): they cannot be turned into the policy's tokens here.
    """
    todo = [t for s in samples for t in s.transitions if _text_only(t)]
    if not todo:
        return 0
    tokenizer = getattr(engine, "tokenizer", None)
    if tokenizer is None:
        raise ValueError(
            f"{len(todo)} captured (text-only) calls need the policy's tokenizer, and this trainer's engine has none; "
            "train on them with the torch backend, or call lightning_rl.capture.retokenize with the tokenizer yourself."
        )
    return retokenize(todo, tokenizer)
