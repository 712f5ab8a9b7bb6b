"""``OpenAIAgentsInstrumentor``: train chosen agents of an OpenAI Agents SDK app, handoffs included.

Two pieces, both global and both undone by ``uninstrument()``:

* a tracing processor (:mod:`._processor`) that knows which agent each span belongs to and records
  role and tool spans. It is installed with ``set_trace_processors``, which also takes the SDK's
  default exporter out (it would try to upload every rollout to the vendor's trace backend);
  processors the user added are kept, and the exporter is put back on ``uninstrument()``;
* per-request routing of the SDK's OpenAI models to the rollout's gateway, on the role URL of the
  calling agent: the first call a model (``OpenAIChatCompletionsModel``, ``OpenAIResponsesModel``)
  makes inside a rollout puts core's routing hook on its ``AsyncOpenAI``'s httpx client, whichever
  the user configured; the hook asks at request time which agent runs (the SDK's current span).
  Wrapping the models' two methods, not ``Runner.run``, leaves ``RunConfig``s, hooks and providers
  alone and covers streaming (``stream_response`` is wrapped without re-yielding).

Roles are agent names (``Agent(name=...)``), so ``trainable=["answerer"]`` trains that agent only.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from lightning_rl.plugins import Instrumentor, Patches, current_route, guarded

if TYPE_CHECKING:  # the SDK is imported on instrument(), after the version check
    from agents.tracing import TracingProcessor

    from lightning_openai_agents._processor import LightningTracingProcessor

__all__ = ["OpenAIAgentsInstrumentor"]

_log = logging.getLogger(__name__)

_ROUTED_METHODS = ("get_response", "stream_response")


def _installed_processors() -> list[TracingProcessor] | None:
    """The SDK's current processor list, or None if this SDK version hides it."""
    from agents.tracing import get_trace_provider

    multi = getattr(get_trace_provider(), "_multi_processor", None)
    processors = getattr(multi, "_processors", None)
    return None if processors is None else list(processors)


def _install_processor(processor: LightningTracingProcessor) -> Callable[[], None]:
    """Put ``processor`` in the SDK's list without the default exporter; returns the undo."""
    from agents.tracing import get_trace_provider, set_trace_processors
    from agents.tracing.processors import default_processor

    current = _installed_processors()
    if current is None:  # cannot see the list: add ours, leave the rest as it is
        get_trace_provider().register_processor(processor)
    removed = [(i, p) for i, p in enumerate(current or ()) if p is default_processor()]
    if current is not None:
        set_trace_processors([p for p in current if p is not default_processor()] + [processor])

    def undo() -> None:
        now = _installed_processors()
        if now is None:
            _log.debug("cannot read the SDK's trace processors; the Lightning processor stays registered (inert)")
            return
        restored = [p for p in now if p is not processor]
        for index, exporter in removed:
            if not any(p is exporter for p in restored):
                restored.insert(min(index, len(restored)), exporter)
        set_trace_processors(restored)

    return undo


def _route_models(patches: Patches) -> None:
    """Wrap the two models' request methods: their client gets the routing hook on its first call
    inside a rollout. The wrapper returns the original's coroutine / async generator, so awaiting,
    streaming and closing behave exactly as without the plugin."""
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    @guarded
    def hook_model(model: Any) -> None:
        if current_route() is not None:  # the SDK creates its default client lazily
            patches.hook_client(getattr(model, "_client", None) or model._get_client())

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def routed(model: Any, *args: Any, **kwargs: Any) -> Any:
            hook_model(model)
            return original(model, *args, **kwargs)

        return routed

    for cls in (OpenAIChatCompletionsModel, OpenAIResponsesModel):
        for method in _ROUTED_METHODS:
            if method in cls.__dict__:
                patches.wrap(cls, method, wrap)


class OpenAIAgentsInstrumentor(Instrumentor):
    """The Lightning plugin for the OpenAI Agents SDK (``openai-agents``).

    ``OpenAIAgentsInstrumentor().instrument(trainable=["answerer"])`` before running agents; no
    other change. Options of ``instrument()``:

    * ``route`` (default True): send model calls made inside a rollout to its gateway. Pass False
      only if the app already points its clients at the rollout's ``LLM`` itself.
    """

    name: ClassVar[str] = "openai-agents"
    framework: ClassVar[str] = "openai-agents"
    supported: ClassVar[str] = ">=0.20,<0.25"  # verified on 0.20 and 0.24; it reads SDK internals
    install_hint: ClassVar[str] = "pip install 'lightning-openai-agents[openai-agents]'"

    _processor: LightningTracingProcessor | None = None
    _routed: bool = False

    @property
    def processor(self) -> LightningTracingProcessor | None:
        """The installed tracing processor (None when not instrumented)."""
        return self._processor

    @property
    def routing(self) -> Patches | None:
        """The install handle routing the models' clients (None when not instrumented or ``route=False``)."""
        return self.patches if self._routed else None

    def _instrument(self, *, route: bool = True, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"unknown option(s) for the openai-agents plugin: {sorted(kwargs)}; known: route")
        from lightning_openai_agents._processor import LightningTracingProcessor

        processor = LightningTracingProcessor(self.is_trainable)
        self.patches.on_restore(processor.shutdown)
        self.patches.on_restore(_install_processor(processor))
        self._processor = processor
        self.patches.on_restore(self._forget)
        if route:
            self.patches.role = processor.current_agent
            _route_models(self.patches)
            self._routed = True

    def _forget(self) -> None:
        self._processor, self._routed = None, False
