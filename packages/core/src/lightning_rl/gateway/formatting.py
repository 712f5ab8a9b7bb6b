"""Turn backend results into OpenAI API payloads (chat completions, completions, responses).

Responses are plain dicts serialised once: on the request path this is cheaper than building
pydantic models. Token ids go to the client in vLLM's extra fields: ``prompt_token_ids`` at the
top level and ``token_ids`` per choice; in a stream the *last* chunk of each choice carries the
choice's full ``token_ids`` and the prompt's ids.
"""

from __future__ import annotations

import os
from itertools import accumulate
from typing import Any

from lightning_rl.engine.base import ParsedToolCall
from lightning_rl.gateway.protocol import GatewayHTTPError, dumps
from lightning_rl.gateway.upstreams import CallResult, CallSpec, ChoiceResult, StreamPiece, tool_calls_json

__all__ = [
    "usage",
    "chat_message",
    "chat_response",
    "chat_delta",
    "completion_response",
    "stream_chunk",
    "usage_chunk",
    "StreamAccumulator",
    "responses_messages",
    "responses_tools",
    "responses_tool_choice",
    "response_object",
    "ResponsesEvents",
    "sse",
    "content_text",
]


def usage(prompt_tokens: int | None, completion_tokens: int | None) -> dict[str, int] | None:
    if prompt_tokens is None and completion_tokens is None:
        return None
    p, c = prompt_tokens or 0, completion_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def sse(payload: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {dumps(payload)}\n\n"


def content_text(content: Any) -> str:
    """Message content as one string for the chat template: a list's text parts (``text``, else
    ``refusal``, as chat and the Responses API spell them) joined."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        return str(content)
    parts: list[str] = []
    for part in content:
        if isinstance(part, dict):
            text = part.get("text")
            text = text if isinstance(text, str) else part.get("refusal")
            if isinstance(text, str):
                parts.append(text)
        elif isinstance(part, str):
            parts.append(part)
    return "".join(parts)


# --- Chat completions ---
def chat_message(choice: ChoiceResult) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.content}
    if choice.tool_calls:
        message["tool_calls"] = tool_calls_json(choice.tool_calls)
        if not choice.content:
            message["content"] = None
    return message


def chat_response(rid: str, created: int, model: str, result: CallResult, want_logprobs: bool) -> dict[str, Any]:
    choices = [
        {
            "index": c.index,
            "message": chat_message(c),
            "logprobs": {"content": c.logprob_entries or []} if want_logprobs else None,
            "finish_reason": c.finish_reason,
            "token_ids": c.token_ids,
        }
        for c in result.choices
    ]
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(result.prompt_tokens, result.completion_tokens),
        "prompt_token_ids": result.prompt_ids,
    }


def chat_delta(piece: StreamPiece, *, first: bool) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant", "content": piece.text} if first else {"content": piece.text}
    if piece.tool_call_deltas:
        delta["tool_calls"] = piece.tool_call_deltas
        if not piece.text:
            delta.pop("content")
    return delta


# --- Completions ---
def _legacy_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any]:
    entries = entries or []
    tokens: list[str] = [e["token"] for e in entries]
    return {
        "tokens": tokens,
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e.get("top_logprobs") or ()} for e in entries],
        "text_offset": list(accumulate(map(len, tokens), initial=0))[:-1],
    }


def completion_response(
    rid: str, created: int, model: str, results: list[CallResult], n: int, want_logprobs: bool
) -> dict[str, Any]:
    """``results`` holds one ``CallResult`` per prompt; choice ``i`` of prompt ``p`` has index ``p * n + i``."""
    choices: list[dict[str, Any]] = []
    prompt_tokens = completion_tokens = 0
    for p, result in enumerate(results):
        prompt_tokens += result.prompt_tokens or 0
        completion_tokens += result.completion_tokens or 0
        for c in result.choices:
            choices.append(
                {
                    "index": p * n + c.index,
                    "text": c.text,
                    "logprobs": _legacy_logprobs(c.logprob_entries) if want_logprobs else None,
                    "finish_reason": c.finish_reason,
                    "token_ids": c.token_ids,
                    "prompt_token_ids": result.prompt_ids,
                }
            )
    body: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }
    if len(results) == 1:
        body["prompt_token_ids"] = results[0].prompt_ids
    return body


def stream_chunk(
    rid: str, created: int, model: str, spec: CallSpec, piece: StreamPiece, acc: StreamAccumulator, *, first: bool
) -> str:
    """The chunk of a chat or completions stream that carries ``piece``; the last piece of a choice
    also carries the choice's token ids and the prompt's."""
    chat = spec.api == "chat"
    choice: dict[str, Any] = {"index": piece.index}
    if chat:
        choice["delta"] = chat_delta(piece, first=first)
        choice["logprobs"] = {"content": piece.logprob_entries or []} if spec.want_logprobs else None
    else:
        choice["text"] = piece.text
        choice["logprobs"] = _legacy_logprobs(piece.logprob_entries) if spec.want_logprobs else None
    choice["finish_reason"] = piece.finish_reason
    chunk = _envelope(rid, created, model, chat, [choice])
    if piece.finish_reason is not None:
        choice["token_ids"] = acc.token_ids(piece.index)
        chunk["prompt_token_ids"] = acc.prompt_ids
    return sse(chunk)


def usage_chunk(rid: str, created: int, model: str, spec: CallSpec, result: CallResult) -> str:
    """The last chunk of a stream whose client asked for ``stream_options.include_usage``."""
    chunk = _envelope(rid, created, model, spec.api == "chat", [])
    chunk["usage"] = usage(result.prompt_tokens, result.completion_tokens)
    return sse(chunk)


def _envelope(rid: str, created: int, model: str, chat: bool, choices: list[dict[str, Any]]) -> dict[str, Any]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": choices}


# --- Stream accumulation (for the last chunk, the recorded span and the Responses API) ---
class _ChoiceAcc:
    __slots__ = ("content", "raw", "ids", "lps", "calls", "finish", "version", "adapter", "parse_error", "exact")

    def __init__(self) -> None:
        self.content: list[str] = []
        self.raw: list[str] = []
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
        self.finish: str | None = None
        self.version: int | None = None
        self.adapter: tuple[str | None, int | None] = (None, None)
        self.parse_error: str | None = None
        self.exact = True


class StreamAccumulator:
    """Collects a stream's pieces into the same ``CallResult`` a non-streamed call produces."""

    def __init__(self, n: int) -> None:
        self._choices = [_ChoiceAcc() for _ in range(n)]
        self.prompt_ids: list[int] | None = None
        self.upstream_usage: dict[str, Any] | None = None

    def add(self, piece: StreamPiece) -> None:
        if piece.prompt_ids is not None and self.prompt_ids is None:
            self.prompt_ids = piece.prompt_ids
        if piece.usage is not None:
            self.upstream_usage = piece.usage
        if piece.index < 0:
            return
        while piece.index >= len(self._choices):
            self._choices.append(_ChoiceAcc())
        acc = self._choices[piece.index]
        if piece.text:
            acc.content.append(piece.text)
        raw = piece.raw_text if piece.raw_text is not None else piece.text
        if raw:
            acc.raw.append(raw)
        acc.ids += piece.token_ids
        acc.lps += piece.logprobs
        acc.exact = acc.exact and piece.tokens_exact
        for d in piece.tool_call_deltas or ():
            slot = acc.calls.setdefault(int(d.get("index", len(acc.calls))), ["", "", ""])
            fn: dict[str, Any] = d.get("function") or {}
            slot[0] = slot[0] or str(d.get("id") or "")
            slot[1] = slot[1] or str(fn.get("name") or "")
            slot[2] += str(fn.get("arguments") or "")
        if piece.finish_reason is not None:
            acc.finish = piece.finish_reason
        if piece.model_version is not None:
            acc.version = piece.model_version
        if piece.adapter is not None:
            acc.adapter = (piece.adapter, piece.adapter_version)
        if piece.parse_error is not None:
            acc.parse_error = piece.parse_error

    def token_ids(self, index: int) -> list[int]:
        return self._choices[index].ids if index < len(self._choices) else []

    def result(self) -> CallResult:
        choices: list[ChoiceResult] = []
        exact = self.prompt_ids is not None
        for i, acc in enumerate(self._choices):
            exact = exact and acc.exact
            calls = [ParsedToolCall(c[0], c[1], c[2]) for _, c in sorted(acc.calls.items())]
            content = "".join(acc.content)
            choices.append(
                ChoiceResult(
                    i,
                    "".join(acc.raw),
                    None if (calls and not content) else content,
                    acc.finish or "stop",
                    calls,
                    token_ids=acc.ids,
                    logprobs=acc.lps,
                    model_version=acc.version,
                    parse_error=acc.parse_error,
                    adapter=acc.adapter[0],
                    adapter_version=acc.adapter[1],
                )
            )
        if exact:
            prompt_tokens: int | None = len(self.prompt_ids or ())
            completion_tokens: int | None = sum(len(c.token_ids or ()) for c in choices)
        else:
            up = self.upstream_usage or {}
            prompt_tokens, completion_tokens = up.get("prompt_tokens"), up.get("completion_tokens")
            for c in choices:
                c.token_ids = c.token_ids or None
                c.logprobs = c.logprobs or None
        return CallResult(self.prompt_ids, choices, exact, prompt_tokens, completion_tokens)


# --- Responses API (the part the OpenAI Agents SDK uses) ---
def responses_messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses ``instructions`` + ``input`` items (checked by ``validation``) as chat messages
    (function calls merged into turns)."""
    messages: list[dict[str, Any]] = []
    if req.get("instructions"):
        messages.append({"role": "system", "content": req["instructions"]})
    items: str | list[dict[str, Any]] = req["input"]
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    for item in items:
        kind = item.get("type") or "message"
        if kind == "message":
            role = str(item.get("role") or "user")
            messages.append(
                {"role": "system" if role == "developer" else role, "content": content_text(item.get("content"))}
            )
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or item.get("id") or ""),
                "type": "function",
                "function": {"name": str(item.get("name") or ""), "arguments": str(item.get("arguments") or "{}")},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = str(item.get("call_id") or "")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content_text(item.get("output"))})
        # "reasoning" and "item_reference" items: nothing the model can consume here
    if not messages or all(m["role"] == "system" for m in messages):
        raise GatewayHTTPError(400, "input is empty: send at least one message.", param="input", code="invalid_value")
    return messages


def responses_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:  # function tools only (see validation)
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def responses_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [_text_part(text)]}


def _call_item(call: ParsedToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + os.urandom(12).hex(),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


def response_object(
    rid: str,
    created: int,
    model: str,
    req: dict[str, Any],
    result: CallResult | None,
    *,
    message_id: str,
) -> dict[str, Any]:
    """A Responses API ``response`` object; ``result=None`` gives the in-progress shell for streams."""
    output: list[dict[str, Any]] = []
    status = "in_progress"
    incomplete: dict[str, Any] | None = None
    usage_obj: dict[str, Any] | None = None
    extra: dict[str, Any] = {}
    if result is not None:
        choice = result.choices[0]
        if choice.content:
            output.append(_message_item(message_id, choice.content))
        output.extend(_call_item(c) for c in choice.tool_calls)
        status = "completed"
        if choice.finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        p, c = result.prompt_tokens or 0, result.completion_tokens or 0
        usage_obj = {
            "input_tokens": p,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": c,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c,
        }
        extra = {"prompt_token_ids": result.prompt_ids, "token_ids": choice.token_ids}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": req.get("parallel_tool_calls", True) is not False,
        "previous_response_id": None,
        "temperature": req.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": req.get("tool_choice") or "auto",
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p"),
        "truncation": "disabled",
        "usage": usage_obj,
        "metadata": req.get("metadata") or {},
        **extra,
    }


class ResponsesEvents:
    """The server-sent events of a streamed Responses call, in the order the OpenAI API sends them."""

    def __init__(self, rid: str, created: int, model: str, req: dict[str, Any]) -> None:
        self.rid, self.created, self.model, self.req = rid, created, model, req
        self.message_id = "msg_" + os.urandom(12).hex()
        self._part = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        self._seq = 0
        self._text: list[str] = []  # the message's deltas so far

    def _event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse(payload, kind)

    def start(self) -> list[str]:
        shell = response_object(self.rid, self.created, self.model, self.req, None, message_id=self.message_id)
        return [self._event("response.created", response=shell), self._event("response.in_progress", response=shell)]

    def text_delta(self, text: str) -> list[str]:
        if not text:
            return []
        out: list[str] = []
        if not self._text:
            item = dict(_message_item(self.message_id, "", "in_progress"), content=[])
            out.append(self._event("response.output_item.added", output_index=0, item=item))
            out.append(self._event("response.content_part.added", **self._part, part=_text_part("")))
        self._text.append(text)
        out.append(self._event("response.output_text.delta", **self._part, delta=text, logprobs=[]))
        return out

    def finish(self, result: CallResult) -> list[str]:
        out: list[str] = []
        final = response_object(self.rid, self.created, self.model, self.req, result, message_id=self.message_id)
        index = 0
        if self._text:
            text = "".join(self._text)
            out.append(self._event("response.output_text.done", **self._part, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", **self._part, part=_text_part(text)))
            out.append(
                self._event("response.output_item.done", output_index=0, item=_message_item(self.message_id, text))
            )
            index = 1
        for item in final["output"]:
            if item["type"] != "function_call":
                continue
            added = dict(item, arguments="", status="in_progress")
            out.append(self._event("response.output_item.added", output_index=index, item=added))
            ids = {"item_id": item["id"], "output_index": index}
            out.append(self._event("response.function_call_arguments.delta", **ids, delta=item["arguments"]))
            out.append(
                self._event(
                    "response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"]
                )
            )
            out.append(self._event("response.output_item.done", output_index=index, item=item))
            index += 1
        kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
        out.append(self._event(kind, response=final))
        return out
