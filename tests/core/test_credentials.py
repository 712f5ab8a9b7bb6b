"""``lightning_rl.credentials``: where tokens come from, how bearer headers are checked, redaction."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lightning_rl.credentials import (
    STORE_TOKEN_ENV,
    bearer_header_matches,
    bearer_matches,
    redact,
    resolve_token,
)


def test_token_sources_in_order(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    token_file.chmod(0o600)
    env = {STORE_TOKEN_ENV: "from-env", f"{STORE_TOKEN_ENV}_FILE": str(token_file), "OLD": "from-old"}
    assert resolve_token(STORE_TOKEN_ENV, flag_file=str(token_file), environ=env) == "from-file"
    with caplog.at_level(logging.WARNING, "lightning_rl.credentials"):
        assert resolve_token(STORE_TOKEN_ENV, flag="from-flag", environ=env) == "from-flag"
    assert "visible to every user" in caplog.text
    assert resolve_token(STORE_TOKEN_ENV, environ=env) == "from-file"  # <NAME>_FILE before <NAME>
    assert resolve_token(STORE_TOKEN_ENV, environ={STORE_TOKEN_ENV: "from-env"}) == "from-env"
    caplog.clear()
    with caplog.at_level(logging.WARNING, "lightning_rl.credentials"):
        assert resolve_token(STORE_TOKEN_ENV, deprecated_envs=["OLD"], environ={"OLD": "from-old"}) == "from-old"
    assert "OLD is deprecated" in caplog.text and STORE_TOKEN_ENV in caplog.text
    assert resolve_token(STORE_TOKEN_ENV, environ={}) is None


def test_bad_token_sources_say_what_to_do(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="not both"):
        resolve_token(STORE_TOKEN_ENV, flag="a", flag_file="b", environ={})
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        resolve_token(STORE_TOKEN_ENV, flag_file=str(empty), environ={})
    with pytest.raises(OSError):
        resolve_token(STORE_TOKEN_ENV, environ={f"{STORE_TOKEN_ENV}_FILE": str(tmp_path / "missing")})
    shared = tmp_path / "shared"
    shared.write_text("tok")
    shared.chmod(0o644)
    with caplog.at_level(logging.WARNING, "lightning_rl.credentials"):
        assert resolve_token(STORE_TOKEN_ENV, flag_file=str(shared), environ={}) == "tok"
    assert "chmod 600" in caplog.text


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (b"Bearer tok", True),
        (b"bearer tok", True),
        (b"BEARER tok", True),
        (b"Bearer  tok", True),
        (b"Bearer tok2", False),
        (b"Basic tok", False),
        (b"tok", False),
        (b"", False),
    ],
)
def test_bearer_scheme_is_case_insensitive(header: bytes, ok: bool) -> None:
    assert bearer_matches(header, b"tok") is ok
    assert bearer_header_matches([(b"host", b"x"), (b"authorization", header)], b"tok") is ok


def test_no_authorization_header_is_refused() -> None:
    assert not bearer_header_matches([(b"host", b"x")], b"tok")


@pytest.mark.parametrize(
    "secret",
    [
        "Authorization: Bearer abcdefghijklmnop",
        "sk-proj-abcdefghijklmnopqrstuvwx",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "AKIAABCDEFGHIJKLMNOP",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "api_key=supersecretvalue",
        'password: "hunter2!"',
    ],
)
def test_redact_replaces_what_looks_like_a_secret(secret: str) -> None:
    text = f"request failed ({secret}) after 3 tries"
    out = redact(text)
    assert "[REDACTED]" in out and out.startswith("request failed (") and out.endswith("after 3 tries")
    assert secret.split()[-1].strip('"') not in out


def test_redact_keeps_ordinary_text_and_takes_a_pattern() -> None:
    text = "ZeroDivisionError: division by zero at agent.py:12 (https://api.example.com/v1)"
    assert redact(text) == text
    assert redact("user 42 failed", r"user \d+") == "[REDACTED] failed"
    assert redact("https://bob:pa55word@db.example.com/x") == "https://[REDACTED]@db.example.com/x"
