"""An upstream that fails: its 4xx/5xx mapped to OpenAI errors, retries only where safe, timeouts, https.

Every server here is real (``FakeUpstream`` scripted to fail, served by uvicorn; over TLS with a
certificate made in the test), so what is checked is what an agent would see.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lightning_rl.gateway import create_gateway_app, running_gateway
from lightning_rl.gateway.upstreams import RetryPolicy, UpstreamBackend
from lightning_rl.testing import FakeReply, FakeUpstream

BODY: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
FAST = RetryPolicy(tries=3, backoff_s=0.001)


async def _post(fake: FakeUpstream, body: dict[str, Any] = BODY, **backend: Any) -> httpx.Response:
    """One chat call through a gateway in front of ``fake``."""
    async with running_gateway(fake.app) as up:
        app = create_gateway_app(UpstreamBackend(up, model="fake-model", **backend))
        async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
            resp = await http.post(f"{url}/v1/chat/completions", json=body)
            await resp.aread()
            return resp


def _content(resp: httpx.Response) -> str:
    """The answer's text, streamed or not."""
    if not resp.text.startswith("data:"):
        return str(resp.json()["choices"][0]["message"]["content"])
    chunks = [json.loads(line[5:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))


async def test_an_upstream_4xx_is_passed_on_with_its_message_and_not_retried() -> None:
    fake = FakeUpstream([FakeReply("context too long for this model", status=400)])
    resp = await _post(fake, retry=FAST)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "context too long for this model"
    assert len(fake.requests) == 1


async def test_an_upstream_5xx_is_retried_then_a_502_that_says_the_upstream_failed() -> None:
    fake = FakeUpstream([FakeReply("out of memory", status=500)] * 3)
    resp = await _post(fake, retry=FAST)
    assert resp.status_code == 502
    error = resp.json()["error"]
    assert error["type"] == "upstream_error" and "out of memory" in error["message"]
    assert len(fake.requests) == 3  # every try of the policy, then given up


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_transient_failure_is_retried_and_the_agent_sees_only_the_answer(status: int, stream: bool) -> None:
    fake = FakeUpstream([FakeReply("busy", status=status), "the answer"])
    resp = await _post(fake, dict(BODY, stream=stream), retry=FAST)
    assert resp.status_code == 200
    assert _content(resp) == "the answer"
    assert len(fake.requests) == 2


async def test_without_retries_a_rate_limit_reaches_the_agent() -> None:
    fake = FakeUpstream([FakeReply("slow down", status=429)])
    resp = await _post(fake, retry=RetryPolicy(tries=1))
    assert resp.status_code == 429 and resp.json()["error"]["message"] == "slow down"
    assert len(fake.requests) == 1


async def test_the_retry_budget_caps_retries_over_all_calls() -> None:
    fake = FakeUpstream([FakeReply("down", status=503)] * 10)
    resp = await _post(fake, retry=RetryPolicy(tries=5, backoff_s=0.001, reserve=1.0, budget=0.0))
    assert resp.status_code == 502
    assert len(fake.requests) == 2  # one retry in the reserve, none earned


async def test_a_hung_upstream_times_out_as_a_503_and_is_not_retried() -> None:
    fake = FakeUpstream([FakeReply("late", delay_s=2.0)])
    resp = await _post(fake, retry=FAST, timeout_s=0.3)
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "upstream_unavailable"
    assert len(fake.requests) == 1


async def test_a_stream_cut_after_its_first_chunk_is_not_retried() -> None:
    fake = FakeUpstream([FakeReply("a long streamed answer", cut_after=1), "never sent"])
    resp = await _post(fake, dict(BODY, stream=True), retry=FAST)
    assert resp.status_code == 200  # the stream had started: the failure is told in-band
    assert '"error"' in resp.text and "never" not in resp.text
    assert len(fake.requests) == 1


async def test_an_upstream_that_is_down_is_a_503_after_the_retries() -> None:
    app = create_gateway_app(UpstreamBackend("http://127.0.0.1:9", model="m", retry=FAST))
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{url}/v1/chat/completions", json=dict(BODY, model="m"))
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "upstream_unavailable"
    backend = app.state.gateway.backend
    assert backend.retries.retried == 2


# --- https ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), made here: no file, no network."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = tmp_path_factory.mktemp("tls")
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


@pytest.fixture
async def https_upstream(certificate: tuple[Path, Path]) -> AsyncIterator[tuple[str, FakeUpstream]]:
    fake = FakeUpstream(["over tls", "streamed over tls"])
    cert_file, key_file = certificate
    async with running_gateway(fake.app, ssl_certfile=str(cert_file), ssl_keyfile=str(key_file)) as url:
        yield url.replace("http://", "https://"), fake


async def test_an_https_upstream_with_a_private_certificate(
    https_upstream: tuple[str, FakeUpstream], certificate: tuple[Path, Path]
) -> None:
    up, fake = https_upstream
    context = ssl.create_default_context(cafile=str(certificate[0]))
    app = create_gateway_app(UpstreamBackend(up, model="fake-model", verify=context))
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
        plain = await http.post(f"{url}/v1/chat/completions", json=BODY)
        streamed = await http.post(f"{url}/v1/chat/completions", json=dict(BODY, stream=True))
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == "over tls"
    assert streamed.status_code == 200 and _content(streamed) == "streamed over tls"
    assert len(fake.requests) == 2


async def test_an_https_upstream_whose_certificate_is_not_trusted_is_refused(
    https_upstream: tuple[str, FakeUpstream],
) -> None:
    up, fake = https_upstream
    app = create_gateway_app(UpstreamBackend(up, model="fake-model", retry=RetryPolicy(tries=1)))
    async with running_gateway(app) as url, httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{url}/v1/chat/completions", json=BODY)
    assert resp.status_code == 503 and "CERTIFICATE_VERIFY_FAILED" in resp.json()["error"]["message"]
    assert fake.requests == []
