"""The inference-engine contract the gateway serves from.

The gateway only ever talks to an ``InferenceEngine``: the embedded transformers engine implements
it in-process; other engines (a vLLM server) are reached by the gateway's upstream mode instead.
Token ids cross this boundary, never re-tokenised text, so what the trainer sees is exactly what
the model consumed and sampled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "SamplingParams",
    "GenerationOutput",
    "StreamDelta",
    "ParsedToolCall",
    "ParsedMessage",
    "InferenceEngine",
]

FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass
class SamplingParams:
    """How to sample one completion. Logprobs are always those of the sampling distribution
    (after temperature scaling and top-p renormalisation), the distribution the trainer uses."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0
    adapter: str | None = None
    """The LoRA adapter to decode with (``TransformersEngine.enable_adapters``); None: the base weights."""


@dataclass
class GenerationOutput:
    """One finished completion."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    model_version: int
    prompt_len: int
    top_logprobs: list[list[tuple[int, float]]] | None = None
    adapter: str | None = None
    """The LoRA adapter that produced it (None: the base weights)."""
    adapter_version: int | None = None
    """That adapter's version (how many times it was loaded)."""


@dataclass
class StreamDelta:
    """A piece of a streamed completion; the last one has ``finish_reason`` set."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason | None = None
    model_version: int = 0
    top_logprobs: list[list[tuple[int, float]]] | None = None
    adapter: str | None = None
    adapter_version: int | None = None


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it


@dataclass
class ParsedMessage:
    """A completion split into assistant content and tool calls.

    ``parse_error`` is set when the model tried to call a tool but emitted invalid JSON: the raw
    text is then returned as content (never a crash) and the span is flagged.
    """

    content: str | None
    tool_calls: list[ParsedToolCall]
    parse_error: str | None = None


@runtime_checkable
class InferenceEngine(Protocol):
    """An engine the gateway can serve. Implementations must be safe under concurrent calls."""

    @property
    def model_name(self) -> str: ...

    @property
    def version(self) -> int:
        """The weights version currently served."""
        ...

    @property
    def max_context(self) -> int:
        """Most tokens (prompt + completion) the model accepts."""
        ...

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        """Render OpenAI-style messages (and tool schemas) with the chat template, ready to generate."""
        ...

    def encode_text(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def parse_assistant(self, text: str) -> ParsedMessage:
        """Split generated text into content and tool calls (the template's tool-call syntax)."""
        ...

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationOutput: ...

    def stream(self, prompt_ids: Sequence[int], params: SamplingParams) -> AsyncIterator[StreamDelta]:
        """Stream a completion; cancelling the iterator frees the request's batch slot."""
        ...

    async def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Atomically swap in new weights between batches; later calls report ``version``."""
        ...
