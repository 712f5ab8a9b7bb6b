"""One in-flight completion: its tokens, incremental text, stop conditions and delivery to the caller.

The worker thread appends one sampled token at a time; this class turns that into what callers see.
Three rules keep the text exact:

- text is decoded incrementally from the token ids (never re-tokenised), and a character split across
  byte-level tokens is held back until it is complete, so streamed pieces are always valid text;
- when stop strings are set, a tail that could still become a stop string is held back too, so a
  stream never shows part of a stop string;
- the final text is ``decode(token_ids)`` cut before the first stop string, and the streamed pieces
  always concatenate to it.

``token_ids`` keep every sampled token, including the eos token and the tokens that completed a stop
string (they were sampled, so the trainer must see them); ``text`` omits both, as the OpenAI API does.
So ``decode(token_ids) == text`` except after a stop string, where ``decode(token_ids)`` starts with
``text + stop``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lightning_rl.engine.base import FinishReason, GenerationOutput, SamplingParams, StreamDelta

if TYPE_CHECKING:
    import torch

__all__ = ["Request", "Delivery"]

Delivery = Callable[["StreamDelta | GenerationOutput | BaseException"], bool]
"""Hands an item to the caller's event loop; returns ``False`` when the caller is gone."""


@dataclass(eq=False)
class Request:
    """A completion being generated. Only the worker thread mutates it, except ``cancel()``."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    eos_ids: frozenset[int]
    decode: Callable[[Sequence[int]], str]
    deliver: Delivery
    generator: torch.Generator
    streaming: bool
    version: int = 0
    adapter_version: int | None = None
    token_ids: list[int] = field(default_factory=lambda: [])
    logprobs: list[float] = field(default_factory=lambda: [])
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason | None = None
    #: Decoded text so far (complete characters only), before stop-string truncation.
    _text: str = ""
    _emitted: int = 0  # characters of _text already streamed
    _sent_tokens: int = 0  # tokens already streamed
    _prefix: int = 0  # incremental-decoding window: tokens [_prefix, _read) were decoded last time
    _read: int = 0
    _cancelled: threading.Event = field(default_factory=threading.Event)
    _final: StreamDelta | GenerationOutput | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Ask the worker to drop this request at its next step (callable from any thread)."""
        self._cancelled.set()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def needs_text(self) -> bool:
        """Whether text must be tracked token by token (for streaming or stop strings)."""
        return self.streaming or bool(self.params.stop)

    def push(self, token: int, logprob: float, top: list[tuple[int, float]] | None) -> None:
        """Record one sampled token and decide whether the request is finished.

        A streamed piece is delivered at once; the final item waits for ``deliver_final()``, which the
        scheduler calls once its own bookkeeping is done (so a caller never sees stale counters).
        """
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        if top is not None:
            if self.top_logprobs is None:
                self.top_logprobs = []
            self.top_logprobs.append(top)
        if token in self.eos_ids:
            self.finish_reason = "stop"
        elif self.needs_text:
            before = len(self._text)
            self._text += self._new_text()
            if self._stop_index(self._text, before) is not None:
                self.finish_reason = "stop"
        if self.finish_reason is None and len(self.token_ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self._finish()
        elif self.streaming:
            self._stream_piece()

    def fail(self, error: BaseException) -> None:
        self.finish_reason = self.finish_reason or "stop"
        self.deliver(error)

    # -- text ---------------------------------------------------------------------------------------

    def _new_text(self) -> str:
        """Text added by the newest tokens; empty while a character is still incomplete."""
        ids = self.token_ids
        known = self.decode(ids[self._prefix : self._read])
        full = self.decode(ids[self._prefix :])
        if len(full) <= len(known) or full.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(ids)
        return full[len(known) :]

    def _stop_index(self, text: str, checked: int) -> int | None:
        """Where the earliest stop string starts in ``text`` (only matches ending after ``checked``)."""
        best: int | None = None
        for stop in self.params.stop:
            index = text.find(stop, max(0, checked - len(stop) + 1))
            if index != -1 and (best is None or index < best):
                best = index
        return best

    def _held_back(self) -> int:
        """Length of the longest tail of the text that could still grow into a stop string."""
        longest = 0
        for stop in self.params.stop:
            for size in range(min(len(stop) - 1, len(self._text)), longest, -1):
                if self._text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _stream_piece(self) -> None:
        safe = len(self._text) - self._held_back()
        piece = self._text[self._emitted : safe] if safe > self._emitted else ""
        self._emitted = max(self._emitted, safe)
        self._send_delta(piece, None)

    def _send_delta(self, text: str, finish: FinishReason | None) -> None:
        start = self._sent_tokens
        self._sent_tokens = len(self.token_ids)
        delta = StreamDelta(
            token_ids=self.token_ids[start:],
            logprobs=self.logprobs[start:],
            text=text,
            finish_reason=finish,
            model_version=self.version,
            top_logprobs=self.top_logprobs[start:] if self.top_logprobs is not None else None,
            adapter=self.params.adapter,
            adapter_version=self.adapter_version,
        )
        if not self.deliver(delta):
            self.cancel()

    def _finish(self) -> None:
        assert self.finish_reason is not None
        text = self.decode(self.token_ids)
        if self.params.stop:
            cut = self._stop_index(text, 0)
            if cut is not None:
                text = text[:cut]
                self.finish_reason = "stop"
        if self.streaming:
            streamed = self._text[: self._emitted]
            rest = text[len(streamed) :] if text.startswith(streamed) else ""
            start, self._sent_tokens = self._sent_tokens, len(self.token_ids)
            self._final = StreamDelta(
                token_ids=self.token_ids[start:],
                logprobs=self.logprobs[start:],
                text=rest,
                finish_reason=self.finish_reason,
                model_version=self.version,
                top_logprobs=self.top_logprobs[start:] if self.top_logprobs is not None else None,
                adapter=self.params.adapter,
                adapter_version=self.adapter_version,
            )
            return
        self._final = GenerationOutput(
            token_ids=list(self.token_ids),
            logprobs=list(self.logprobs),
            text=text,
            finish_reason=self.finish_reason,
            model_version=self.version,
            prompt_len=len(self.prompt_ids),
            top_logprobs=self.top_logprobs,
            adapter=self.params.adapter,
            adapter_version=self.adapter_version,
        )

    def deliver_final(self) -> None:
        """Hand the finished completion (or the stream's last piece) to the caller."""
        if self._final is not None:
            final, self._final = self._final, None
            self.deliver(final)
