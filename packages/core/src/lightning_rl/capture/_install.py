"""``capture()``: turn on the standard OpenTelemetry LLM instrumentations for rollouts, in one call.

It installs the chosen family's instrumentors (the OpenAI client, plus LangChain / LangGraph and the
OpenAI Agents SDK when they and their instrumentation are installed) on a tracer provider that has a
:class:`~lightning_rl.tracing.otel.LightningSpanProcessor`, so every span started inside a rollout
reaches that rollout's span sink, and the adapter turns the model-call spans into transitions.

A tracer provider the user already set up is reused, not replaced: their processors and exporters
keep receiving every span (inside rollouts and outside), and Lightning only adds its processor.
Without one, ``capture`` installs a provider whose sampler records spans only inside a rollout, so
production traffic of the same process costs nothing.

This module imports OpenTelemetry only when ``capture`` runs.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import threading
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from lightning_rl.errors import MissingExtraError
from lightning_rl.extras import install_command, require_extra
from lightning_rl.tracing._context import current_rollout

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from lightning_rl.tracing.otel import LightningSpanProcessor

__all__ = ["Family", "Capture", "capture", "FRAMEWORKS"]

_log = logging.getLogger("lightning_rl.capture")

Family = Literal["openllmetry", "openinference"]
"""``openllmetry``: OpenTelemetry GenAI conventions (``gen_ai.*``, Traceloop's instrumentations);
``openinference``: Arize's OpenInference conventions (``llm.*``, ``input.value``, ``tool.*``)."""

# framework -> (module whose presence means the framework is used, instrumentor per family)
FRAMEWORKS: dict[str, tuple[str, dict[Family, tuple[str, str, str]]]] = {
    "openai": (
        "openai",
        {
            "openllmetry": (
                "opentelemetry.instrumentation.openai",
                "OpenAIInstrumentor",
                "opentelemetry-instrumentation-openai",
            ),
            "openinference": (
                "openinference.instrumentation.openai",
                "OpenAIInstrumentor",
                "openinference-instrumentation-openai",
            ),
        },
    ),
    "langchain": (
        "langchain_core",
        {
            "openllmetry": (
                "opentelemetry.instrumentation.langchain",
                "LangchainInstrumentor",
                "opentelemetry-instrumentation-langchain",
            ),
            "openinference": (
                "openinference.instrumentation.langchain",
                "LangChainInstrumentor",
                "openinference-instrumentation-langchain",
            ),
        },
    ),
    "openai_agents": (
        "agents",
        {
            "openllmetry": (
                "opentelemetry.instrumentation.openai_agents",
                "OpenAIAgentsInstrumentor",
                "opentelemetry-instrumentation-openai-agents",
            ),
            "openinference": (
                "openinference.instrumentation.openai_agents",
                "OpenAIAgentsInstrumentor",
                "openinference-instrumentation-openai-agents",
            ),
        },
    ),
}
"""What ``capture`` can instrument. LangChain covers LangGraph; other frameworks (CrewAI, AutoGen)
have instrumentations of their own that work the same way once installed and instrumented on the
provider ``capture`` returns (``Capture.provider``); they are not wired here."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@dataclass
class Capture:
    """What one ``capture()`` call set up. ``close()`` uninstruments what it instrumented."""

    family: Family
    provider: TracerProvider
    processor: LightningSpanProcessor
    frameworks: list[str]
    """The frameworks instrumented by this call (an instrumentor someone had already turned on is
    left as it was, and not listed)."""
    owns_provider: bool
    """True when ``capture`` created the tracer provider (no SDK provider was installed)."""
    _instrumentors: list[Any] = field(default_factory=list[Any], repr=False)

    def close(self) -> None:
        """Stop routing spans to rollouts and uninstrument what this call instrumented.

        The provider stays (it may be yours); its Lightning processor stops routing. A later
        ``capture()`` starts afresh.
        """
        self.processor.shutdown()
        for instrumentor in self._instrumentors:
            try:
                instrumentor.uninstrument()
            except Exception:  # pragma: no cover - an instrumentation's own failure
                _log.warning("could not uninstrument %r", instrumentor, exc_info=True)
            _unwrap_leftovers(type(instrumentor).__module__)
        self._instrumentors.clear()
        with _lock:
            if _active.get(self.family) is self:
                del _active[self.family]


_lock = threading.Lock()
_active: dict[Family, Capture] = {}


def _unwrap_leftovers(package: str) -> int:
    """Restore OpenAI client methods still wrapped by ``package`` after its ``uninstrument()``.

    ``opentelemetry-instrumentation-openai`` 0.62 leaves its wrappers in place when uninstrumented
    (its ``unwrap`` calls miss), so instrumenting again would record every call twice. Its wrappers
    are wrapt ``FunctionWrapper`` objects whose wrapper function lives in the instrumentation's
    package: each found on a class of ``openai.resources`` is replaced by what it wraps.
    """
    if not package:
        return 0
    restored = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("openai.resources"):
            continue
        for cls in list(vars(module).values()):
            if not isinstance(cls, type) or not cls.__module__.startswith("openai."):
                continue
            for attr, value in list(vars(cls).items()):
                wrapper = getattr(value, "_self_wrapper", None)
                if wrapper is None or not hasattr(value, "__wrapped__"):
                    continue
                if str(getattr(wrapper, "__module__", "")).startswith(package):
                    setattr(cls, attr, value.__wrapped__)
                    restored += 1
    if restored:
        _log.debug("restored %d OpenAI client methods left wrapped by %s", restored, package)
    return restored


def _rollout_sampler() -> Any:
    """A sampler that records a span only inside a rollout (or under a parent that is recorded)."""
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

    class InRolloutSampler(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: Any = None,
            attributes: Any = None,
            links: Any = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            parent = otel_trace.get_current_span(parent_context).get_span_context()
            inside = current_rollout() is not None or (parent.is_valid and parent.trace_flags.sampled)
            return SamplingResult(Decision.RECORD_AND_SAMPLE if inside else Decision.DROP, attributes)

        def get_description(self) -> str:
            return "LightningInRolloutSampler"

    return InRolloutSampler()


def _provider(tracer_provider: TracerProvider | None) -> tuple[TracerProvider, bool]:
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import TracerProvider

    if tracer_provider is not None:
        return tracer_provider, False
    current = otel_trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current, False
    provider = TracerProvider(sampler=_rollout_sampler())
    otel_trace.set_tracer_provider(provider)
    if otel_trace.get_tracer_provider() is not provider:  # pragma: no cover - a non-SDK provider was set first
        raise RuntimeError(
            "another OpenTelemetry tracer provider (not the SDK's) is already global; pass "
            "capture(tracer_provider=...) with an opentelemetry.sdk.trace.TracerProvider."
        )
    return provider, True


def _wanted(family: Family, frameworks: Iterable[str] | None) -> list[str]:
    if frameworks is None:  # the client, plus each framework in use whose instrumentation is installed
        found = ["openai"]
        for name, (module, by_family) in FRAMEWORKS.items():
            if name != "openai" and _installed(module) and _installed(by_family[family][0]):
                found.append(name)
        return found
    wanted = list(frameworks)
    for name in wanted:
        if name not in FRAMEWORKS:
            raise ValueError(f"capture cannot instrument {name!r}; choose from {sorted(FRAMEWORKS)}.")
        module, package = FRAMEWORKS[name][1][family][0], FRAMEWORKS[name][1][family][2]
        if not _installed(module):
            raise MissingExtraError(
                f"capture({family!r}, frameworks=[{name!r}]) needs {package} (not installed): "
                + (install_command(["capture"]) if name == "openai" else f"pip install {package}"),
                name=module,
            )
    return wanted


def capture(
    family: Family = "openinference",
    *,
    frameworks: Sequence[str] | None = None,
    tracer_provider: TracerProvider | None = None,
) -> Capture:
    """Record the agent's model calls with a standard OpenTelemetry instrumentation, inside rollouts.

    Add this one call to an agent that calls any OpenAI-compatible endpoint (a hosted API, a
    server that is not Lightning's gateway): each call made inside a rollout becomes a text-level
    transition, which SFT, APO and the dashboard use as it is and RL re-tokenises with the policy's
    tokenizer (``lightning_rl.capture.retokenize``)::

        import lightning_rl
        lightning_rl.capture("openinference")   # or "openllmetry"

    Args:
        family: Which instrumentation family to install.
        frameworks: What to instrument: ``"openai"`` (the client), ``"langchain"`` (LangChain and
            LangGraph: adds roles from graph nodes), ``"openai_agents"`` (the Agents SDK: roles
            from agent names). Default: the client, plus each framework that is installed and
            whose instrumentation package is installed.
        tracer_provider: The SDK tracer provider to use. Default: the global one if it is an SDK
            provider (yours: its exporters keep receiving every span), else a new global one
            that records spans only inside rollouts.

    Calling it again for the same family returns the same ``Capture``, with any framework newly
    named instrumented too.
    """
    if family not in get_args(Family):
        raise ValueError(f"capture family must be one of {get_args(Family)}, not {family!r}.")
    require_extra("otel", feature="lightning_rl.capture")
    from lightning_rl.tracing.otel import configure_opentelemetry

    with _lock:
        wanted = _wanted(family, frameworks)
        done = _active.get(family)
        if done is not None:
            if tracer_provider is not None and tracer_provider is not done.provider:
                raise ValueError(
                    f"capture({family!r}) is already on with another tracer provider; call close() on it first."
                )
        else:
            provider, owns = _provider(tracer_provider)
            processor = configure_opentelemetry(provider)
            done = Capture(family=family, provider=provider, processor=processor, frameworks=[], owns_provider=owns)
        for name in wanted:
            if name in done.frameworks:
                continue
            module_name, class_name, _package = FRAMEWORKS[name][1][family]
            with warnings.catch_warnings():
                # instrumentations import modules written for older pydantic/OpenTelemetry APIs; their
                # deprecation warnings are theirs to fix, and must not fail a program run with -W error
                warnings.simplefilter("ignore", DeprecationWarning)
                instrumentor = getattr(importlib.import_module(module_name), class_name)()
                if cast(bool, getattr(instrumentor, "is_instrumented_by_opentelemetry", False)):
                    _log.info("%s is already instrumented; its spans go to the provider it was given", class_name)
                    continue
                instrumentor.instrument(tracer_provider=done.provider)
            done.frameworks.append(name)
            done._instrumentors.append(instrumentor)  # pyright: ignore[reportPrivateUsage]
        _active[family] = done
        _log.info("capture(%s): instrumented %s", family, ", ".join(done.frameworks) or "nothing new")
        return done
