"""The embedded engine: a Hugging Face ``transformers`` causal LM served in-process with dynamic batching.

Why a worker thread: a forward pass holds the GIL for long stretches of C++ and would stall an asyncio
server, so every tensor operation runs on one dedicated thread that owns the model. The async API
(``generate``, ``stream``, ``load_weights``) only enqueues work and awaits results delivered back to
the caller's event loop, so the engine serves any number of loops (and threads) at once.

The worker runs a continuous-batching loop. Each iteration either

1. applies pending weight swaps, once no sequence is running (so every completion is produced by a
   single version, which it reports), or
2. admits waiting requests (up to ``max_batch_size`` rows) with one batched prefill whose rows join
   the running KV cache (see ``_batch.KVBatch``), or
3. runs one batched decode step for every running row.

With ``enable_adapters`` each request may name a LoRA adapter (``SamplingParams.adapter``, per-role
training; ``lightning_rl.engine.lora``): admitted prompts are prefilled one adapter at a time, and
decode steps run every row together, each with its own adapter.

Rows leave as soon as they finish or their caller cancels (a closed stream, a cancelled task), which
frees their slot for the next waiting request. Sampling and logprobs follow
``lightning_rl.engine.logprobs`` exactly, in float32, with a per-request CPU ``torch.Generator``
(seeded from ``SamplingParams.seed``), so the same seed gives the same tokens whatever else is batched
alongside, up to float rounding differences between batch shapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import torch

from lightning_rl.engine._prefix import SharedPrefixBatch
from lightning_rl.engine._request import Request
from lightning_rl.engine.base import GenerationOutput, ParsedMessage, SamplingParams, StreamDelta
from lightning_rl.engine.logprobs import sampling_logprobs
from lightning_rl.engine.toolcalls import parse_tool_calls
from lightning_rl.errors import InvalidRequestError

if TYPE_CHECKING:
    from lightning_rl.engine.lora import AdapterBank, AdapterWeights

__all__ = ["TransformersEngine", "EngineStats", "ChatPrompts"]

DTypeName = Literal["auto", "float32", "bfloat16", "float16"]


@dataclass
class EngineStats:
    """Counters of the scheduler, for tests, benchmarks and ``/metrics``."""

    requests: int = 0
    finished: int = 0
    cancelled: int = 0
    failed: int = 0
    prefills: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    #: Most rows ever decoded together in one step.
    peak_batch: int = 0
    running: int = 0
    waiting: int = 0
    version: int = 0
    #: Rows per prefill call, most recent last (bounded).
    prefill_sizes: list[int] = field(default_factory=lambda: [])
    #: Prompt tokens run through the model by prefills, and prompt tokens they did not need to run
    #: (duplicate prompts and a prefix shared by the admitted prompts are computed once).
    prefill_tokens: int = 0
    prefill_tokens_saved: int = 0


@dataclass(eq=False)
class _Swap:
    state_dict: Mapping[str, Any]
    version: int
    done: Future[None] = field(default_factory=lambda: Future())
    apply: Callable[[], None] | None = None
    """Instead of copying ``state_dict``: what to run (an adapter load, ``load_adapters``)."""


def _resolve_dtype(dtype: DTypeName | torch.dtype | None, device: torch.device) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == "auto":
        return "auto"
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in names:
        raise InvalidRequestError(f"unknown dtype {dtype!r}: use one of {sorted(names)} or 'auto'")
    return names[dtype]


def _normalise_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI-style message -> the shape HF chat templates expect (text content, dict arguments)."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        parts = cast(list[Any], content)
        out["content"] = "".join(
            str(part.get("text", "")) for part in parts if isinstance(part, Mapping) and "text" in part
        )
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        normalised: list[Any] = []
        for call in cast(list[Any], calls):
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                call_map = cast(Mapping[str, Any], call)
                function = dict(cast(Mapping[str, Any], call_map["function"]))
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    try:
                        function["arguments"] = json.loads(arguments)
                    except ValueError:
                        pass  # the template renders the string as it is
                normalised.append({**call_map, "function": function})
            else:
                normalised.append(call)
        out["tool_calls"] = normalised
    return out


_CHAT_CACHE_SIZE = 1024


def _chat_key(
    template: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
) -> tuple[str, str] | None:
    """The cache key of a chat request, or ``None`` when it must be rendered every time (a template
    that reads the clock, or messages that are not plain JSON)."""
    if not isinstance(template, str) or "strftime_now" in template:
        return None
    try:
        return template, json.dumps([messages, tools], separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return None


class ChatPrompts:
    """Prompt ids of chat requests, rendered with a tokenizer's chat template.

    It needs the tokenizer only, so code that prepares prompts without generating (the warm starts)
    does not load a second copy of the model for it. Identical requests are common (the
    ``group_size`` rollouts of a GRPO group open with the same messages), and rendering the template
    with jinja plus tokenising costs ~1 ms of CPU on the event loop per call; so recent results are
    kept, keyed by the request's JSON (and the template). Templates that read the clock
    (``strftime_now``) are never cached.
    """

    def __init__(self, tokenizer: Any, model_name: str = "model") -> None:
        self.tokenizer = tokenizer
        self._model_name = model_name
        self._cache: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        """The prompt ids of ``messages`` (and ``tools``), ending with the assistant's generation prompt."""
        if not messages:
            raise InvalidRequestError("messages is empty: send at least one message")
        template = getattr(self.tokenizer, "chat_template", None)
        if template is None:
            raise InvalidRequestError(
                f"model {self._model_name!r} has no chat template; use the completions API or set a chat_template"
            )
        key = _chat_key(template, messages, tools)
        if key is not None:
            with self._lock:
                cached = self._cache.get(key)
                if cached is not None:
                    self._cache.move_to_end(key)
                    return list(cached)
        try:
            text = self.tokenizer.apply_chat_template(
                [_normalise_message(m) for m in messages],
                tools=[dict(t) for t in tools] if tools else None,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as exc:  # jinja2 errors: the messages do not fit the template
            raise InvalidRequestError(f"the chat template could not render these messages: {exc}") from exc
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if key is not None:
            with self._lock:
                self._cache[key] = tuple(ids)
                while len(self._cache) > _CHAT_CACHE_SIZE:
                    self._cache.popitem(last=False)
        return ids


class TransformersEngine:
    """An ``InferenceEngine`` over a ``transformers`` causal LM (CPU or one CUDA device).

    Build it with ``from_pretrained`` (a local HF folder such as the tiny kit's, or a Hub name), or
    pass an already loaded model and tokenizer. Call ``close()`` (or use ``with``) to stop the worker.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_name: str = "model",
        max_batch_size: int = 16,
        max_context: int | None = None,
        batch_wait_s: float = 0.002,
        version: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise InvalidRequestError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._max_batch_size = max_batch_size
        self._batch_wait_s = batch_wait_s
        self._device = next(model.parameters()).device
        self._vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._max_context = max_context or self._context_from_config(model)
        self._eos_ids = self._find_eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else min(self._eos_ids))
        self._aliases = self._tied_groups(model)
        self._version = version
        self._base_version = version  # the version of the base weights (per-role adapters: rows of no adapter)
        self._adapters: AdapterBank | None = None
        self._borrowed: set[str] = set()  # parameters whose storage another model owns (borrow_weights)
        self._stats = EngineStats(version=version)
        self._cond = threading.Condition()
        self._waiting: deque[Request] = deque()
        self._swaps: deque[_Swap] = deque()
        self._closed = False
        self._running: list[Request] = []  # worker thread only
        self._batch = SharedPrefixBatch(model, self._pad_id, self._device)
        self._chat = ChatPrompts(tokenizer, model_name)
        self._thread = threading.Thread(target=self._work, name=f"lightning-engine-{model_name}", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        path_or_name: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: DTypeName | torch.dtype | None = None,
        max_batch_size: int = 16,
        max_context: int | None = None,
        model_name: str | None = None,
        batch_wait_s: float = 0.002,
        attn_implementation: str | None = None,
    ) -> TransformersEngine:
        """Load a causal LM and its tokenizer the standard way (``AutoModelForCausalLM`` / ``AutoTokenizer``).

        Args:
            path_or_name: an HF folder or a Hub model name; or what ``lightning_rl.engine.models.resolve_model``
                resolves: ``tiny``, ``smollm2-135m``, a ``.gguf`` file (converted once to a cached folder).
            device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
            dtype: weights dtype; default float32 on CPU and bfloat16 on CUDA. Logprobs are always
                computed in float32.
            max_batch_size: most sequences decoded together.
            max_context: most prompt + completion tokens; default the model's ``max_position_embeddings``.
            model_name: the name the engine serves under; default the short name, the GGUF file's stem or
                the folder's name.
            batch_wait_s: how long an idle engine waits for concurrent arrivals before its first prefill.
            attn_implementation: passed to ``from_pretrained`` (``"sdpa"``, ``"eager"`` …).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lightning_rl.engine.models import resolve_model, served_model_name

        name = model_name or served_model_name(path_or_name)
        path_or_name = resolve_model(path_or_name)
        torch_device = torch.device(device)
        if torch_device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidRequestError("device='cuda' was requested but torch sees no CUDA device; use device='cpu'")
        kwargs: dict[str, Any] = {"dtype": _resolve_dtype(dtype, torch_device)}
        if attn_implementation is not None:
            kwargs["attn_implementation"] = attn_implementation
        tokenizer = AutoTokenizer.from_pretrained(path_or_name)
        model: Any = AutoModelForCausalLM.from_pretrained(path_or_name, **kwargs)
        model = model.to(torch_device)
        return cls(
            model,
            tokenizer,
            model_name=name,
            max_batch_size=max_batch_size,
            max_context=max_context,
            batch_wait_s=batch_wait_s,
        )

    # -- configuration helpers ---------------------------------------------------------------------

    @staticmethod
    def _context_from_config(model: Any) -> int:
        value = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if not isinstance(value, int) or value <= 0:
            raise InvalidRequestError("the model config has no max_position_embeddings; pass max_context=")
        return value

    @staticmethod
    def _find_eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(model, "generation_config", None), model.config, tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in cast(Sequence[Any], value))
        if not ids:
            raise InvalidRequestError("the model has no eos token id; set generation_config.eos_token_id")
        return frozenset(ids)

    @staticmethod
    def _tied_groups(model: Any) -> dict[str, str]:
        """State-dict key -> the first key sharing its storage (tied embeddings appear under two keys)."""
        first: dict[tuple[int, tuple[int, ...]], str] = {}
        aliases: dict[str, str] = {}
        for key, tensor in model.state_dict().items():
            marker = (tensor.data_ptr(), tuple(tensor.shape))
            aliases[key] = first.setdefault(marker, key)
        return aliases

    # -- InferenceEngine: properties and text ------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        return self._max_context

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def model(self) -> Any:
        """The served model. Do not modify it while requests run: use ``load_weights``."""
        return self._model

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_ids

    def stats(self) -> EngineStats:
        """A snapshot of the scheduler counters."""
        with self._cond:
            snapshot = replace(self._stats, prefill_sizes=list(self._stats.prefill_sizes))
            snapshot.waiting = len(self._waiting)
        return snapshot

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[int]:
        """Prompt ids of ``messages`` (and ``tools``) rendered with the chat template (``ChatPrompts``)."""
        return self._chat.encode(messages, tools)

    def encode_text(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=True))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens (eos, chat markers), exactly as generated."""
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def parse_assistant(self, text: str) -> ParsedMessage:
        return parse_tool_calls(text)

    # -- InferenceEngine: generation ---------------------------------------------------------------

    def _check(self, prompt_ids: Sequence[int], params: SamplingParams) -> int:
        """Validate a request and return its effective max new tokens."""
        if self._closed:
            raise RuntimeError("the engine is closed; create a new one")
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty: send at least one token")
        if len(prompt_ids) >= self._max_context:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context is {self._max_context} "
                "tokens (prompt + completion); shorten the prompt"
            )
        if any(not 0 <= int(t) < self._vocab_size for t in prompt_ids):
            raise InvalidRequestError(f"prompt token ids must be in [0, {self._vocab_size})")
        if params.max_tokens < 1:
            raise InvalidRequestError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if not params.temperature >= 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {params.top_p}")
        if params.top_logprobs < 0:
            raise InvalidRequestError(f"top_logprobs must be >= 0, got {params.top_logprobs}")
        if any(not s for s in params.stop):
            raise InvalidRequestError("stop strings must be non-empty")
        if params.adapter is not None and params.adapter not in self.adapter_names:
            raise InvalidRequestError(f"no adapter {params.adapter!r} is loaded; loaded: {self.adapter_names}")
        return min(params.max_tokens, self._max_context - len(prompt_ids))

    def _submit(self, prompt_ids: Sequence[int], params: SamplingParams, streaming: bool) -> tuple[Request, Any]:
        max_new = self._check(prompt_ids, params)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[StreamDelta | GenerationOutput | BaseException] = asyncio.Queue()

        def deliver(item: StreamDelta | GenerationOutput | BaseException) -> bool:
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody is listening any more
                return False
            return True

        generator = torch.Generator(device="cpu")
        generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        request = Request(
            prompt_ids=[int(t) for t in prompt_ids],
            params=params,
            max_new_tokens=max_new,
            eos_ids=self._eos_ids,
            decode=self.decode,
            deliver=deliver,
            generator=generator,
            streaming=streaming,
        )
        with self._cond:
            self._waiting.append(request)
            self._stats.requests += 1
            self._cond.notify_all()
        return request, inbox

    def _cancel(self, request: Request) -> None:
        if not request.finished:
            request.cancel()
            with self._cond:
                self._cond.notify_all()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationOutput:
        """Generate one completion; cancelling the awaiting task frees the request's batch slot."""
        request, inbox = self._submit(prompt_ids, params, streaming=False)
        try:
            item = await inbox.get()
        finally:
            self._cancel(request)
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, GenerationOutput)
        return item

    async def stream(self, prompt_ids: Sequence[int], params: SamplingParams) -> AsyncIterator[StreamDelta]:
        """Stream a completion token by token; closing the iterator early frees the request's slot."""
        request, inbox = self._submit(prompt_ids, params, streaming=True)
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, StreamDelta)
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            self._cancel(request)

    async def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Swap in ``state_dict`` (the full model, by state-dict key) as ``version``.

        The swap waits for the running sequences to finish, while new requests wait for the swap, so
        each completion is produced by exactly one version. Tied weights may be given under either key.
        Tensors may live on any device and have any float dtype; they are copied into the served model
        before this returns, so do not modify them until then.
        """
        self._check_state_dict(state_dict)
        swap = _Swap(state_dict=state_dict, version=version)
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed; create a new one")
            self._swaps.append(swap)
            self._cond.notify_all()
        await asyncio.wrap_future(swap.done)

    def _check_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        own = self._model.state_dict()
        unknown = sorted(set(state_dict) - set(own))
        if unknown:
            raise InvalidRequestError(f"load_weights got keys the model does not have: {unknown[:5]}")
        covered = {self._aliases[k] for k in state_dict}
        missing = sorted(set(self._aliases.values()) - covered)
        if missing:
            raise InvalidRequestError(
                f"load_weights needs the full state dict; missing {missing[:5]} (merge LoRA adapters first)"
            )
        for key, value in state_dict.items():
            shape = tuple(getattr(value, "shape", ()))
            if shape != tuple(own[key].shape):
                expected = tuple(own[key].shape)
                raise InvalidRequestError(f"load_weights: {key} has shape {shape}, the model has {expected}")

    def borrow_weights(self, model: torch.nn.Module) -> int:
        """Serve ``model``'s tensors instead of this engine's own copies, wherever a parameter of the
        same name (PEFT's ``.base_layer`` left out), shape, dtype and device exists; returns the bytes
        no longer held twice. Call it before the first request.

        For a trainer that keeps a frozen base and trains LoRA adapters: the base then sits in memory
        once (SmolLM2 in bfloat16: 0.27 GB less). ``load_weights`` never writes into a borrowed
        tensor: a new value gets a tensor of its own (the merged weights of the adapted layers), and
        a value that is the borrowed tensor itself is skipped, so the owner's weights never change."""
        theirs = {name.replace(".base_layer.", "."): p for name, p in model.named_parameters()}
        saved = 0
        with self._cond:
            if self._stats.requests:
                raise RuntimeError("borrow_weights() must be called before the engine serves any request.")
            with torch.no_grad():
                for name, param in self._model.named_parameters():
                    other = theirs.get(name)
                    if other is None or (other.shape, other.dtype, other.device) != (
                        param.shape,
                        param.dtype,
                        param.device,
                    ):
                        continue
                    if other.data_ptr() != param.data_ptr():
                        saved += param.numel() * param.element_size()
                        param.data = other.data
                    self._borrowed.add(name)
        return saved

    # -- LoRA adapters, one per row (per-role training; lightning_rl.engine.lora) ---------------------

    def enable_adapters(self, targets: Sequence[str]) -> None:
        """Serve LoRA adapters over this model's own weights, chosen per request by
        ``SamplingParams.adapter``: the modules named ``*.<target>`` get a per-row LoRA path. Call it
        before the first request."""
        from lightning_rl.engine.lora import AdapterBank

        with self._cond:
            if self._stats.requests or self._adapters is not None:
                raise RuntimeError("enable_adapters() must be called once, before the engine serves any request.")
            self._adapters = AdapterBank.install(self._model, targets)

    @property
    def adapter_names(self) -> list[str]:
        """The adapters loaded so far (empty without ``enable_adapters``)."""
        return self._adapters.names if self._adapters is not None else []

    def adapter_version(self, name: str) -> int | None:
        """How many times adapter ``name`` was loaded (None: never)."""
        return self._adapters.version_of(name) if self._adapters is not None else None

    async def load_adapters(self, adapters: Mapping[str, AdapterWeights], version: int) -> None:
        """Add or replace the named adapters as weights ``version``, between batches like ``load_weights``.

        Only the named adapters change; the base weights and the other adapters stay as they are.
        Calls served by an adapter afterwards report ``version`` as their model version, and the
        adapter's own version (one more than before); calls of no adapter keep the base's version.
        """
        if self._adapters is None:
            raise InvalidRequestError("this engine serves no adapters: call enable_adapters() first")
        bank = self._adapters
        swap = _Swap(state_dict={}, version=version, apply=lambda: bank.load(adapters))
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed; create a new one")
            self._swaps.append(swap)
            self._cond.notify_all()
        await asyncio.wrap_future(swap.done)

    def close(self) -> None:
        """Stop the worker; requests still waiting or running fail with ``RuntimeError``."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def __enter__(self) -> TransformersEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the worker thread -------------------------------------------------------------------------

    def _work(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._closed or self._waiting or self._running or self._swaps):
                        self._cond.wait()
                    if self._closed:
                        break
                try:
                    self._iteration()
                except Exception as exc:  # a failed forward pass fails its batch, never the engine
                    self._fail_running(exc)
        closed = RuntimeError("the engine was closed before this request finished")
        self._fail_running(closed)
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
            swaps, self._swaps = list(self._swaps), deque()
        for request in waiting:
            request.fail(closed)
        for swap in swaps:
            swap.done.set_exception(closed)

    def _fail_running(self, error: BaseException) -> None:
        for request in self._running:
            request.fail(error)
        with self._cond:
            self._stats.failed += len(self._running)
            self._stats.running = 0
        self._running = []
        self._batch.reset()

    def _iteration(self) -> None:
        self._drop_cancelled()
        if self._swaps:
            if not self._running:
                self._apply_swaps()
                return
        else:
            admitted = self._admit()
            if admitted:
                self._prefill(admitted)
                return
        if self._running:
            self._decode()

    def _drop_cancelled(self) -> None:
        with self._cond:
            dropped = sum(1 for r in self._waiting if r.cancelled)
            if dropped:
                self._waiting = deque(r for r in self._waiting if not r.cancelled)
            self._stats.cancelled += dropped
        if any(r.cancelled for r in self._running):
            self._retire([i for i, r in enumerate(self._running) if r.cancelled], cancelled=True)

    def _admit(self) -> list[Request]:
        room = self._max_batch_size - len(self._running)
        if room <= 0 or not self._batch.can_merge:
            return []
        with self._cond:
            if not self._waiting:
                return []
            if not self._running and self._batch_wait_s > 0 and len(self._waiting) < room:
                # An idle engine: give requests sent at the same moment a chance to share the prefill.
                deadline = time.monotonic() + self._batch_wait_s
                while len(self._waiting) < room and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
            admitted = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
        admitted = [r for r in admitted if not r.cancelled]
        for request in admitted:
            request.version = self._version
            if self._adapters is not None:
                adapter = request.params.adapter
                request.version = self._version if adapter is not None else self._base_version
                request.adapter_version = self._adapters.version_of(adapter)
        return admitted

    def _prefill(self, admitted: list[Request]) -> None:
        # one prefill per adapter (a prompt prefix shared across adapters has different keys and values)
        # and per whether a prompt continues the prefix the batch holds (those run only their own tokens)
        groups: dict[tuple[str | None, bool], list[Request]] = {}
        for request in admitted:
            adapter = request.params.adapter if self._adapters is not None else None
            held = self._batch.on_held_prefix(request.prompt_ids, adapter)
            groups.setdefault((adapter, held), []).append(request)
        for (adapter, _), group in groups.items():
            if self._adapters is None:
                self._prefill_rows(group, None)
                continue
            with self._adapters.uniform(self._adapters.slot(adapter)):
                self._prefill_rows(group, adapter)

    def _prefill_rows(self, admitted: list[Request], adapter: str | None) -> None:
        try:
            logits = self._batch.prefill([r.prompt_ids for r in admitted], key=adapter)
        except Exception as exc:  # e.g. out of memory: fail the newcomers, the running rows are untouched
            for request in admitted:
                request.fail(exc)
            with self._cond:
                self._stats.failed += len(admitted)
            return
        self._running.extend(admitted)
        with self._cond:
            self._stats.prefills += 1
            self._stats.prefill_sizes = [*self._stats.prefill_sizes[-99:], len(admitted)]
            self._stats.prefill_tokens += self._batch.last_computed_tokens
            self._stats.prefill_tokens_saved += self._batch.last_saved_tokens
            self._stats.running = len(self._running)
        self._sample(admitted, logits)

    def _decode(self) -> None:
        bank = self._adapters
        rows = bank.rows([bank.slot(r.params.adapter) for r in self._running]) if bank else contextlib.nullcontext()
        with rows:
            logits = self._batch.decode([r.token_ids[-1] for r in self._running])
        with self._cond:
            self._stats.decode_steps += 1
            self._stats.peak_batch = max(self._stats.peak_batch, len(self._running))
        self._sample(self._running, logits)

    def _sample(self, rows: list[Request], logits: torch.Tensor) -> None:
        """Sample one token for each of ``rows`` (the last ``len(rows)`` rows of the batch)."""
        temperature = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32, device=logits.device)
        top_p = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=logits.device)
        logp = sampling_logprobs(logits, temperature, top_p)
        greedy = temperature <= 0
        # Inverse-CDF sampling with one uniform draw per row from the row's own CPU generator, so a seed
        # gives the same draws on any device and whatever else shares the batch.
        uniform = torch.stack([torch.rand((), generator=r.generator, dtype=torch.float64) for r in rows])
        cdf = logp.double().exp().cumsum(-1)
        targets = (uniform.to(logits.device) * cdf[:, -1]).unsqueeze(-1)
        sampled = torch.searchsorted(cdf, targets, right=True).squeeze(-1).clamp(max=logp.shape[-1] - 1)
        tokens = torch.where(greedy, logp.argmax(-1), sampled)
        chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        k = max(r.params.top_logprobs for r in rows)
        top_ids: list[list[int]] = []
        top_values: list[list[float]] = []
        if k > 0:
            values, ids = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
            top_ids, top_values = ids.tolist(), values.tolist()
        token_list: list[int] = tokens.tolist()
        chosen_list: list[float] = chosen.tolist()
        for i, request in enumerate(rows):
            top = None
            if request.params.top_logprobs > 0:
                pairs = zip(top_ids[i][: request.params.top_logprobs], top_values[i], strict=False)
                top = [(tid, value) for tid, value in pairs if value != float("-inf")]
            request.push(token_list[i], chosen_list[i], top)
        with self._cond:
            self._stats.generated_tokens += len(rows)
        done = [i for i, r in enumerate(self._running) if r.finished or r.cancelled]
        if done:
            leaving = [self._running[i] for i in done]
            self._retire(done, cancelled=False)
            for request in leaving:
                request.deliver_final()

    def _retire(self, indices: list[int], *, cancelled: bool) -> None:
        gone = set(indices)
        keep = [i for i in range(len(self._running)) if i not in gone]
        self._batch.keep(keep)
        with self._cond:
            if cancelled:
                self._stats.cancelled += len(gone)
            else:
                self._stats.finished += sum(1 for i in gone if self._running[i].finished)
                self._stats.cancelled += sum(1 for i in gone if not self._running[i].finished)
            self._running = [self._running[i] for i in keep]
            self._stats.running = len(self._running)

    def _apply_swaps(self) -> None:
        with self._cond:
            swaps, self._swaps = list(self._swaps), deque()
        params = self._model.state_dict()
        named = dict(self._model.named_parameters(remove_duplicate=False))
        for swap in swaps:
            try:
                if swap.apply is not None:
                    swap.apply()
                else:
                    for key, value in swap.state_dict.items():
                        value = torch.as_tensor(value)
                        if params[key].data_ptr() == value.data_ptr():
                            continue  # the tensor served already (a borrowed base weight)
                        if key in self._borrowed:  # another model's tensor: never written, replaced
                            owned = torch.empty_like(params[key]).copy_(value)
                            named[key].data = owned
                            params[key] = owned
                            self._borrowed.discard(key)
                        else:
                            params[key].copy_(value)
                    self._base_version = swap.version
            except Exception as exc:
                swap.done.set_exception(exc)
                continue
            self._version = swap.version
            with self._cond:
                self._stats.version = swap.version
            swap.done.set_result(None)
