"""The agent contract: what a user writes and what the runner hands it.

An agent is a plain function ``agent(task, llm) -> float | None``, synchronous or ``async``. It
receives the task's input (``Task.input``, any JSON value) and an :class:`LLM` describing where to
send its model calls: the rollout's own gateway URL, so concurrent rollouts never mix and every
call is recorded with exact token ids. The agent keeps its framework; it only points the
framework's OpenAI client at ``llm.base_url``. The reward is the return value, or, when it
returns ``None``, the last value passed to :func:`lightning_rl.tracing.emit_reward`.

Anything callable with that signature is an agent (a function, a ``functools.partial``, an object
with ``__call__``); there is no base class to inherit. ``load_agent("module:function")`` resolves
the ``--agent`` option of ``lightning-rl runner``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import ssl
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import quote

from lightning_rl.types import LLMResource

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI

__all__ = [
    "LLM",
    "AgentFn",
    "SyncAgentFn",
    "AsyncAgentFn",
    "rollout_base_url",
    "is_async_agent",
    "load_agent",
]

SyncAgentFn: TypeAlias = Callable[[Any, "LLM"], float | None]
"""A synchronous agent: runs in its own thread, with the rollout context copied into it."""
AsyncAgentFn: TypeAlias = Callable[[Any, "LLM"], Awaitable[float | None]]
"""An ``async`` agent: runs as a task on the runner's event loop."""
AgentFn: TypeAlias = SyncAgentFn | AsyncAgentFn
"""``agent(task_input, llm) -> reward | None``, sync or async."""


def _frozen_mapping() -> Mapping[str, Any]:
    return MappingProxyType({})


def rollout_base_url(gateway_url: str, rollout_id: str, attempt_id: str, key: str | None = None) -> str:
    """The OpenAI base URL of one attempt: ``<gateway>/rollouts/{rollout_id}/attempts/{attempt_id}/key/{key}/v1``.

    ``gateway_url`` is the gateway root (``LLMResource.base_url``); a trailing ``/v1`` is tolerated
    and dropped, so a resource published as ``http://host:port/v1`` routes the same way. ``key`` is
    the attempt's ``gateway_key``: the gateway records a call into the attempt only when it carries
    it, and every framework keeps a base URL's path, so the agent carries it without knowing.
    """
    root = gateway_url.rstrip("/").removesuffix("/v1")
    tail = f"/key/{quote(key, safe='')}" if key else ""
    return f"{root}/rollouts/{rollout_id}/attempts/{attempt_id}{tail}/v1"


@dataclass(frozen=True)
class LLM:
    """Where and how the agent calls its model during one rollout attempt.

    Attributes:
        base_url: The attempt's own OpenAI-compatible base URL on the gateway (ends in ``/v1``).
        model: The model name to put in requests.
        api_key: The key to send (the gateway's token when it requires one).
        sampling: Sampling parameters to pass on each call (e.g. ``temperature``, ``max_tokens``).
        resources_version: The resources version this rollout runs with, if known.
        role: The agent role the gateway attributes calls to (see ``for_role``), if any.
    """

    base_url: str
    model: str
    api_key: str = "lightning"
    sampling: Mapping[str, Any] = field(default_factory=_frozen_mapping)
    resources_version: int | None = None
    role: str | None = None

    def __post_init__(self) -> None:
        # Frozen means frozen: a shared dict would let one rollout's agent change another's sampling.
        object.__setattr__(self, "sampling", MappingProxyType(dict(self.sampling)))

    @classmethod
    def for_attempt(
        cls,
        resource: LLMResource,
        rollout_id: str,
        attempt_id: str,
        *,
        resources_version: int | None = None,
        key: str | None = None,
    ) -> LLM:
        """Build the LLM of one attempt from a published ``LLMResource`` (whose URL is the gateway root);
        ``key`` is the attempt's ``gateway_key`` (``claim.attempt.gateway_key``)."""
        return cls(
            base_url=rollout_base_url(resource.base_url, rollout_id, attempt_id, key),
            model=resource.model,
            api_key=resource.api_key,
            sampling=resource.sampling,
            resources_version=resources_version,
        )

    def for_role(self, role: str) -> LLM:
        """The same endpoint with calls attributed to ``role`` (``.../roles/{role}/v1`` on the gateway).

        Give each agent of a multi-agent system its own ``LLM`` this way, so the trainer knows
        exactly which role made each call (and can train only some roles) without guessing.
        """
        if not role:
            raise ValueError("role must be a non-empty string, e.g. 'planner'.")
        root = self.base_url.rstrip("/").removesuffix("/v1")
        if self.role is not None:
            root = root.removesuffix(f"/roles/{quote(self.role, safe='')}")
        return replace(self, base_url=f"{root}/roles/{quote(role, safe='')}/v1", role=role)

    def openai_client(self, **kwargs: Any) -> OpenAI:
        """A synchronous ``openai.OpenAI`` client pointed at this attempt's gateway URL.

        Extra keyword arguments go to the client (e.g. ``timeout``, ``max_retries``). Unless one is
        given, the client gets its own ``http_client`` built as the SDK builds it but with a TLS
        context shared by every client of the process (see ``async_openai_client``).
        """
        openai = _import_openai()
        if "http_client" not in kwargs:
            kwargs["http_client"] = _sdk_http_client(openai, asynchronous=False)
        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)

    def async_openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` client pointed at this attempt's gateway URL.

        Agents create a client per rollout (the URL is per attempt), and the SDK's default HTTP
        client builds a fresh TLS context each time, loading the whole CA bundle: ~15 ms of CPU with
        the GIL held (even for an ``http://`` gateway), which stalled the event loop and the engine
        thread for ~2 s per demo step of 128 rollouts. Unless ``http_client`` is given, the client
        gets its own ``http_client`` (same settings as the SDK's: timeout, limits, redirects; closed
        with the client) whose TLS context is built once per process and shared; CA certificates
        are then read once, and ``SSL_CERT_FILE``/``SSL_CERT_DIR`` are honoured as httpx does.

        When the gateway of ``base_url`` is served in this process on the running event loop (the
        trainer's in-process runner), model calls skip the socket and go straight to the gateway's
        handlers (see ``lightning_rl.gateway.inprocess``); any other request still uses HTTP.
        """
        openai = _import_openai()
        if "http_client" not in kwargs:
            kwargs["http_client"] = _sdk_http_client(openai, asynchronous=True, base_url=self.base_url)
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


@functools.cache
def _shared_ssl_context() -> ssl.SSLContext:
    """The TLS context httpx would build for ``verify=True``, built once (it is safe to share)."""
    import httpx

    return httpx.create_ssl_context()


def _sdk_http_client(openai: Any, *, asynchronous: bool, base_url: str | None = None) -> Any:
    """The httpx client the SDK would build for itself, but on the shared TLS context (and, for an
    async client of a gateway served in this process, with the in-process transport).

    The SDK's own wrappers (``AsyncHttpxClientWrapper``, ``SyncHttpxClientWrapper``) add only a
    close-when-collected to ``DefaultAsyncHttpxClient``/``DefaultHttpxClient`` (the SDK's timeout,
    connection limits and redirects); they are private, so fall back to the public classes.
    """
    name = "AsyncHttpxClientWrapper" if asynchronous else "SyncHttpxClientWrapper"
    cls = getattr(getattr(openai, "_base_client", None), name, None)
    if cls is None:
        cls = openai.DefaultAsyncHttpxClient if asynchronous else openai.DefaultHttpxClient
    if asynchronous and base_url is not None:
        transport = _in_process_transport(openai, base_url)
        if transport is not None:
            return cls(transport=transport)
    return cls(verify=_shared_ssl_context())


def _in_process_transport(openai: Any, base_url: str) -> Any:
    """The in-process transport to the gateway of ``base_url`` if it is served here, else ``None``."""
    import httpx

    from lightning_rl.gateway.inprocess import in_process_transport, serving_here

    if not serving_here(base_url):
        return None
    client_cls = getattr(openai, "DefaultAsyncHttpxClient", None)
    if not (isinstance(client_cls, type) and issubclass(client_cls, httpx.AsyncClient)):
        # The transport speaks httpx 1.x; an SDK on another HTTP library (openai 3.x uses httpx2)
        # rejects its responses, so such clients keep plain HTTP to the gateway.
        return None
    limits = getattr(getattr(openai, "_constants", None), "DEFAULT_CONNECTION_LIMITS", None)
    fallback = httpx.AsyncHTTPTransport(verify=_shared_ssl_context(), **({"limits": limits} if limits else {}))
    return in_process_transport(base_url, fallback)


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ImportError(
            "LLM.openai_client() needs the openai package: pip install openai (or pip install 'lightning-rl[train]')."
        ) from exc
    return openai


def is_async_agent(agent: Callable[..., Any]) -> bool:
    """Whether ``agent`` is an ``async`` function (also through ``functools.partial`` or ``__call__``)."""
    if inspect.iscoroutinefunction(agent):
        return True
    call = getattr(agent, "__call__", None)  # noqa: B004 - we want the bound method, not callable()
    return call is not None and inspect.iscoroutinefunction(call)


def load_agent(spec: str) -> AgentFn:
    """Resolve ``"package.module:function"`` (or ``"module:obj.attr"``) to the agent callable.

    The current directory is put on ``sys.path`` first, as ``uvicorn`` and ``python -m`` do, so a
    module next to where the runner starts is found.

    Raises:
        ValueError: The spec is not ``module:attribute`` or names something that is not callable.
        ImportError: The module cannot be imported.
    """
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"--agent must look like 'package.module:function', got {spec!r}.")
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ImportError(
                f"cannot import agent module {module_name!r}: {exc}. Run the runner from the folder that "
                "contains it or add that folder to PYTHONPATH."
            ) from exc
        raise
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(
                f"module {module_name!r} has no attribute {attr_path!r} (from --agent {spec!r})."
            ) from None
    if not callable(obj):
        raise ValueError(f"{spec!r} is a {type(obj).__name__}, not a callable agent(task, llm).")
    return cast("AgentFn", obj)
