"""Errors raised by Lightning.

Each error subclasses the builtin a caller would naturally catch (``KeyError``-like lookups are
``LookupError``, bad values are ``ValueError``) and its message says what to do next. The HTTP layers
map them to status codes (see ``http_status``) so a client sees the same exception class the server
raised, and so a client mistake is never answered with a retried 500.
"""

from __future__ import annotations

__all__ = [
    "LightningError",
    "NotFoundError",
    "IllegalTransitionError",
    "ConflictError",
    "InvalidRequestError",
    "UnauthorizedError",
    "StoreUnavailableError",
    "IncompatibleFrameworkError",
    "MissingExtraError",
    "http_status",
    "error_from_status",
]


class LightningError(Exception):
    """Base class of every error Lightning raises on purpose."""


class NotFoundError(LightningError, LookupError):
    """A rollout, attempt, span or resources version does not exist (HTTP 404)."""


class IllegalTransitionError(LightningError, ValueError):
    """A status change the state machine forbids, e.g. ``timed_out -> succeeded`` (HTTP 409)."""


class ConflictError(LightningError, ValueError):
    """A write collides with existing data, e.g. an id reused for a different task (HTTP 409)."""


class InvalidRequestError(LightningError, ValueError):
    """The request is malformed or out of the allowed range (HTTP 400)."""


class UnauthorizedError(LightningError, PermissionError):
    """A missing or wrong bearer token (HTTP 401)."""


class StoreUnavailableError(LightningError, ConnectionError):
    """The store could not be reached after retries; the caller may retry later (HTTP 503)."""


class IncompatibleFrameworkError(LightningError, ImportError):
    """A plugin's agent framework is missing or outside the version range the plugin supports."""


class MissingExtraError(LightningError, ImportError):
    """An optional extra of ``lightning-rl`` is not installed; the message names the pip command."""


_STATUS: dict[type[LightningError], int] = {
    NotFoundError: 404,
    IllegalTransitionError: 409,
    ConflictError: 409,
    InvalidRequestError: 400,
    UnauthorizedError: 401,
    StoreUnavailableError: 503,
}

_BY_NAME: dict[str, type[LightningError]] = {cls.__name__: cls for cls in _STATUS}


def http_status(error: LightningError) -> int:
    """The HTTP status code that represents ``error``."""
    for cls in type(error).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]  # type: ignore[index]
    return 500


def error_from_status(status: int, kind: str | None, message: str) -> LightningError:
    """Rebuild the exception a server reported, so clients raise what the server raised."""
    if kind and kind in _BY_NAME:
        return _BY_NAME[kind](message)
    for cls, code in _STATUS.items():
        if code == status:
            return cls(message)
    return LightningError(f"HTTP {status}: {message}")
