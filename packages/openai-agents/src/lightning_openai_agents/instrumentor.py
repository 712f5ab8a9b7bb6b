"""``OpenAIAgentsInstrumentor``: train chosen agents of an OpenAI Agents SDK app, handoffs included.

Two pieces, both global and both undone by ``uninstrument()``:

* a tracing processor (:mod:`._processor`) that knows which agent each span belongs to and records
  role and tool spans. It is installed with ``set_trace_processors``, which also takes the SDK's
  default exporter out (it would try to upload every rollout to the vendor's trace backend);
  processors the user added are kept, and the exporter is put back on ``uninstrument()``;
* per-request routing of the SDK's OpenAI models (:mod:`._routing`) to the rollout's gateway, on
  the role URL of the calling agent.

Roles are agent names (``Agent(name=...)``), so ``trainable=["answerer"]`` trains that agent only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from lightning_rl.plugins import Instrumentor

if TYPE_CHECKING:  # the SDK is imported on instrument(), after the version check
    from agents.tracing import TracingProcessor

    from lightning_openai_agents._processor import LightningTracingProcessor
    from lightning_openai_agents._routing import ModelRouting

__all__ = ["OpenAIAgentsInstrumentor"]

_log = logging.getLogger(__name__)


def _installed_processors() -> list[TracingProcessor] | None:
    """The SDK's current processor list, or None if this SDK version hides it."""
    from agents.tracing import get_trace_provider

    multi = getattr(get_trace_provider(), "_multi_processor", None)
    processors = getattr(multi, "_processors", None)
    return None if processors is None else list(processors)


def _is_default_exporter(processor: TracingProcessor) -> bool:
    """Whether ``processor`` is the SDK's default exporter (uploads to the vendor's backend)."""
    from agents.tracing.processors import default_processor

    return processor is default_processor()


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
    _routing: ModelRouting | None = None
    _removed_exporter: tuple[int, TracingProcessor] | None = None

    @property
    def processor(self) -> LightningTracingProcessor | None:
        """The installed tracing processor (None when not instrumented)."""
        return self._processor

    @property
    def routing(self) -> ModelRouting | None:
        """The installed model routing (None when not instrumented or ``route=False``)."""
        return self._routing

    def _instrument(self, *, route: bool = True, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"unknown option(s) for the openai-agents plugin: {sorted(kwargs)}; known: route")
        from agents.tracing import get_trace_provider, set_trace_processors

        from lightning_openai_agents._processor import LightningTracingProcessor
        from lightning_openai_agents._routing import ModelRouting

        processor = LightningTracingProcessor(self.is_trainable)
        current = _installed_processors()
        if current is None:  # cannot see the list: add ours, leave the rest as it is
            get_trace_provider().register_processor(processor)
        else:
            kept: list[TracingProcessor] = []
            for index, existing in enumerate(current):
                if _is_default_exporter(existing):
                    self._removed_exporter = (index, existing)
                else:
                    kept.append(existing)
            set_trace_processors([*kept, processor])
        self._processor = processor
        if route:
            self._routing = ModelRouting(processor.current_agent)
            self._routing.install()

    def _uninstrument(self) -> None:
        from agents.tracing import set_trace_processors

        if self._routing is not None:
            self._routing.uninstall()
            self._routing = None
        processor, self._processor = self._processor, None
        current = _installed_processors()
        if current is not None:
            restored = [p for p in current if p is not processor]
            if self._removed_exporter is not None:
                index, exporter = self._removed_exporter
                if not any(p is exporter for p in restored):
                    restored.insert(min(index, len(restored)), exporter)
            set_trace_processors(restored)
        else:
            _log.debug("cannot read the SDK's trace processors; the Lightning processor stays registered (inert)")
        self._removed_exporter = None
        if processor is not None:
            processor.shutdown()
