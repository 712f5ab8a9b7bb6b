"""Where the command line finds its secrets, how servers check them, and how error text is scrubbed.

One name per secret, the same for the server that checks it and for every client that sends it:

* ``LIGHTNING_STORE_TOKEN``: the store server's bearer token (``lightning-rl store serve``) and what
  every store client sends (``lightning-rl runner``, the gateway's ``--store``).
* ``LIGHTNING_GATEWAY_TOKEN``: the gateway's API key.

Each may instead name a file: ``<NAME>_FILE`` (or ``--token-file``), whose content (a trailing
newline stripped) is the token, which is how container secrets and systemd credentials are
mounted. Nothing needs a token on the command line: ``--token`` still works but is visible to every
local user in the process list, so it logs a warning. ``LIGHTNING_TOKEN``, the runner's old name for
the store token, still works with a deprecation message.

``bearer_matches`` implements RFC 7235's rule that the auth scheme is case-insensitive
(``bearer x`` equals ``Bearer x``), in constant time over the credentials.

``redact`` replaces what looks like a key or token in free text (an agent's exception message
often quotes a request that carried one) before it is stored in ``rollout.error``.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import re
import stat
from collections.abc import Iterable, Sequence

__all__ = [
    "STORE_TOKEN_ENV",
    "GATEWAY_TOKEN_ENV",
    "DEPRECATED_STORE_TOKEN_ENVS",
    "FILE_SUFFIX",
    "resolve_token",
    "read_token_file",
    "bearer_matches",
    "bearer_header_matches",
    "is_loopback",
    "refuse_exposed_without_token",
    "DEFAULT_SECRET_PATTERN",
    "REDACTED",
    "redact",
]

_log = logging.getLogger("lightning_rl.credentials")

STORE_TOKEN_ENV = "LIGHTNING_STORE_TOKEN"
"""The store's bearer token, for the server and for its clients."""
GATEWAY_TOKEN_ENV = "LIGHTNING_GATEWAY_TOKEN"
"""The gateway's API key."""
DEPRECATED_STORE_TOKEN_ENVS: tuple[str, ...] = ("LIGHTNING_TOKEN",)
"""Older names of ``STORE_TOKEN_ENV`` (the runner read ``LIGHTNING_TOKEN``); read with a warning."""
FILE_SUFFIX = "_FILE"
"""``<NAME>_FILE`` names a file that holds the token of ``<NAME>``."""


def read_token_file(path: str) -> str:
    """The token in ``path`` (surrounding whitespace stripped).

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is empty or the token contains whitespace inside it.
    """
    with open(path, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        token = f.read().strip()
    if not token:
        raise ValueError(f"token file {path} is empty; write the token into it.")
    if any(c.isspace() for c in token):
        raise ValueError(f"token file {path} holds more than one word; it must hold only the token.")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        _log.warning("token file %s is readable by other users; chmod 600 it.", path)
    return token


def resolve_token(
    env: str,
    *,
    flag: str | None = None,
    flag_file: str | None = None,
    deprecated_envs: Sequence[str] = (),
    environ: dict[str, str] | None = None,
) -> str | None:
    """The token a command should use, or None when none is configured.

    Looked up in this order: ``--token-file`` (``flag_file``), ``--token`` (``flag``, with a warning:
    command lines are public), the file named by ``<env>_FILE``, the variable ``env``, then each of
    ``deprecated_envs`` (with a deprecation warning).

    Raises:
        ValueError: both ``flag`` and ``flag_file`` were given, or a token file is empty.
        OSError: a token file cannot be read.
    """
    environ = os.environ.copy() if environ is None else environ
    if flag and flag_file:
        raise ValueError("give the token either with --token or with --token-file, not both.")
    if flag_file:
        return read_token_file(flag_file)
    if flag:
        _log.warning(
            "a token on the command line is visible to every user of this machine (ps); prefer --token-file or %s.",
            env,
        )
        return flag
    file_path = environ.get(env + FILE_SUFFIX)
    if file_path:
        return read_token_file(file_path)
    value = environ.get(env)
    if value:
        return value
    for old in deprecated_envs:
        value = environ.get(old)
        if value:
            _log.warning("%s is deprecated and will be removed; set %s instead (same value).", old, env)
            return value
    return None


def bearer_matches(header_value: bytes, token: bytes) -> bool:
    """Whether an ``Authorization`` value carries ``token`` with the ``Bearer`` scheme, in any case.

    The credentials are compared in constant time; the scheme is not secret.
    """
    scheme, _, credentials = header_value.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(credentials.strip(b" "), token)


def bearer_header_matches(headers: Iterable[tuple[bytes, bytes]], token: bytes) -> bool:
    """``bearer_matches`` on the first ``authorization`` header of raw ASGI headers."""
    for key, value in headers:
        if key == b"authorization":
            return bearer_matches(value, token)
    return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname may resolve to a public address: treat it as exposed


def refuse_exposed_without_token(host: str, token: str | None, server: str, risk: str, how: str) -> None:
    """Servers bind 127.0.0.1 by default; any other address needs a token. ``PermissionError`` naming
    ``risk`` (what anyone who reaches ``server`` could do) and ``how`` (how to pass a token) otherwise."""
    if not is_loopback(host) and not token:
        raise PermissionError(
            f"refusing to serve {server} on {host} without a token: anyone who can reach it could {risk}. "
            f"{how}, or bind 127.0.0.1."
        )


DEFAULT_SECRET_PATTERN = (
    r"(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}"  # an Authorization header value
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"  # OpenAI/Anthropic/Stripe style keys
    r"|\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{20,}"  # GitHub tokens
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack tokens
    r"|\bAKIA[0-9A-Z]{16}\b"  # AWS access key ids
    r"|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JSON web tokens
    r"|(?i:api[_-]?key|secret|token|password|passwd|authorization)[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?i:bearer|basic|token)\s+)?[^\s\"',;&]{4,}"  # key = value, key: "value", Authorization: Bearer x
    r"|(?<=://)[^/\s:@]+:[^/\s@]+(?=@)"  # user:password in a URL
)
"""What ``redact`` replaces by default: values that look like keys, tokens or passwords."""

REDACTED = "[REDACTED]"

_DEFAULT_RE = re.compile(DEFAULT_SECRET_PATTERN)


def redact(text: str, pattern: str | re.Pattern[str] | None = None) -> str:
    """``text`` with every match of ``pattern`` (default ``DEFAULT_SECRET_PATTERN``) replaced by ``[REDACTED]``."""
    regex = _DEFAULT_RE if pattern is None else re.compile(pattern) if isinstance(pattern, str) else pattern
    return regex.sub(REDACTED, text)
