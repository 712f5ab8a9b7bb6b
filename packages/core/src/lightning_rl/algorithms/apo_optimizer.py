"""The optimiser LLM of APO: critique a prompt from failed rollouts, then edit it.

Any OpenAI-compatible ``/v1/chat/completions`` endpoint works (a hosted model, a vLLM server, or
the Lightning gateway's own embedded model offline). Two calls per edit, as in "textual gradient"
prompt optimisation: first a **critique** ("what in this prompt made the agent fail on these
transcripts?"), then an **edit** ("rewrite the prompt to fix that"). Keeping them apart lets the
critique be stored and read next to the candidate it produced, which is how a person judges whether
the optimiser is reasoning or guessing.

The client is plain ``httpx`` (a core dependency), so APO needs no SDK; transient failures (429,
5xx, connection errors) are retried with backoff, anything else raises ``OptimizerError`` with the
endpoint's own message.
"""

from __future__ import annotations

import asyncio
import logging
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import httpx

__all__ = [
    "OptimizerError",
    "OptimizerClient",
    "Edit",
    "critique_messages",
    "edit_messages",
    "extract_prompt",
    "template_fields",
]

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})

_SYSTEM = (
    "You improve the prompt template of an AI agent. The agent runs the template on many tasks and "
    "gets a score per task (higher is better). You are shown the template and transcripts of tasks "
    "where it scored poorly."
)

_CRITIQUE = """Current prompt template:
<prompt>
{template}
</prompt>

Transcripts of tasks where the agent scored poorly with this template:

{failures}

In a few sentences: what in the template led to these failures, and what should change in it?
Do not rewrite the template yet."""

_EDIT = """Current prompt template:
<prompt>
{template}
</prompt>

Critique of the template, from the agent's failures:
{critique}

Write an improved template that fixes what the critique says.{fields_rule}
Reply with the new template only, between <prompt> and </prompt>."""


class OptimizerError(RuntimeError):
    """The optimiser endpoint refused or failed a call; the message says which and why."""


@dataclass(frozen=True)
class Edit:
    """One edit of a template by the optimiser, with the critique that motivated it."""

    template: str
    critique: str


def template_fields(template: str) -> frozenset[str]:
    """The ``{field}`` names of a ``str.format`` template (``{{``/``}}`` are literal braces).

    A template that is not valid ``str.format`` syntax (a stray brace) has no fields: it is then
    used as plain text, and an edit is not asked to keep any.
    """
    try:
        return frozenset(name for _, name, _, _ in string.Formatter().parse(template) if name)
    except ValueError:
        return frozenset()


def critique_messages(template: str, failures: Sequence[str]) -> list[dict[str, str]]:
    """The chat messages asking for a critique of ``template`` from failure transcripts."""
    shown = "\n\n".join(f"--- transcript {i + 1} ---\n{text}" for i, text in enumerate(failures))
    return [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": _CRITIQUE.format(template=template, failures=shown)},
    ]


def edit_messages(template: str, critique: str) -> list[dict[str, str]]:
    """The chat messages asking for a new template that fixes what ``critique`` says."""
    fields = sorted(template_fields(template))
    rule = (
        " Keep these placeholders exactly as written, each in braces: " + ", ".join("{" + f + "}" for f in fields) + "."
        if fields
        else ""
    )
    return [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": _EDIT.format(template=template, critique=critique, fields_rule=rule)},
    ]


_PROMPT_TAG = re.compile(r"<prompt>\s*(.*?)\s*(?:</prompt>|$)", re.DOTALL | re.IGNORECASE)


def extract_prompt(reply: str) -> str:
    """The new template in an edit reply: the text inside ``<prompt>...</prompt>`` (the last such
    block; an unclosed tag runs to the end), else the whole reply, stripped."""
    blocks = [m.group(1) for m in _PROMPT_TAG.finditer(reply)]
    text = next((b for b in reversed(blocks) if b.strip()), reply)
    return text.strip()


class OptimizerClient:
    """Chat completions against one OpenAI-compatible endpoint.

    Args:
        base_url: The endpoint's base URL, ending in ``/v1`` (e.g. ``https://api.openai.com/v1``).
        model: The model name to request.
        api_key: Sent as ``Authorization: Bearer``; None sends none (local servers).
        temperature: Sampling temperature of the optimiser's calls.
        max_tokens: Most tokens per optimiser reply.
        timeout_s: Longest wait for one call.
        retries: Retries of a transient failure (429, 5xx, connection error), with backoff.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        temperature: float = 0.7,
        max_tokens: int = 512,
        timeout_s: float = 120.0,
        retries: int = 3,
    ) -> None:
        if not base_url:
            raise ValueError("the optimiser needs a base URL, e.g. https://api.openai.com/v1.")
        if not model:
            raise ValueError("the optimiser needs a model name (APOConfig.optimizer_model).")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.retries = retries
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.calls = 0
        """Completed optimiser calls (critiques and edits)."""

    async def chat(self, messages: list[dict[str, str]]) -> str:
        """One chat completion; returns the reply's text (empty when the model said nothing)."""
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        url = f"{self.base_url}/chat/completions"
        for attempt in range(self.retries + 1):
            try:
                resp = await self._client.post(url, json=body)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise OptimizerError(f"the optimiser at {url} is unreachable: {exc}") from exc
            else:
                if resp.status_code < 400:
                    self.calls += 1
                    return _reply_text(resp, url)
                if resp.status_code not in _RETRY_STATUS or attempt == self.retries:
                    raise OptimizerError(
                        f"the optimiser at {url} answered {resp.status_code}: {resp.text[:500]} "
                        "(check APOConfig.optimizer_base_url, optimizer_model and the API key)."
                    )
            delay = 0.5 * 2**attempt
            log.info("optimiser call failed; retrying in %.1f s", delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def critique(self, template: str, failures: Sequence[str]) -> str:
        """What in ``template`` caused the ``failures`` (rendered transcripts), in the optimiser's words."""
        return (await self.chat(critique_messages(template, failures))).strip()

    async def edit(self, template: str, failures: Sequence[str]) -> Edit:
        """A critique of ``template`` from ``failures``, then the template rewritten to address it."""
        critique = await self.critique(template, failures)
        reply = await self.chat(edit_messages(template, critique))
        return Edit(template=extract_prompt(reply), critique=critique)

    async def aclose(self) -> None:
        await self._client.aclose()


def _reply_text(resp: httpx.Response, url: str) -> str:
    try:
        data = cast(dict[str, Any], resp.json())
        message = cast(dict[str, Any], data["choices"][0]["message"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise OptimizerError(f"the optimiser at {url} did not answer like chat completions: {resp.text[:300]}") from exc
    content = message.get("content")
    return content if isinstance(content, str) else ""
