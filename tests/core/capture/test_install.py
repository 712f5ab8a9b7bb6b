"""``capture()`` and the global tracer provider, each case in a fresh process (a process sets it once).

* Without a provider, ``capture`` installs one whose sampler records only inside rollouts.
* With the user's own global SDK provider, ``capture`` reuses it: the user's exporter receives every
  span (inside rollouts and outside), and the rollout's sink gets the rollout's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from lightning_rl.capture import capture

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import openai
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import lightning_rl
    from lightning_rl.gateway import running_gateway
    from lightning_rl.testing import FakeUpstream
    from lightning_rl.tracing import rollout_context

    exporter = InMemorySpanExporter()
    if sys.argv[1] == "user":
        mine = TracerProvider()
        mine.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(mine)
    cap = lightning_rl.capture(sys.argv[2])

    async def call(url):
        client = openai.AsyncOpenAI(base_url=url, api_key="sk", max_retries=0)
        try:
            r = await client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
            return r.choices[0].message.content
        finally:
            await client.close()

    async def main():
        async with running_gateway(FakeUpstream(["one", "two"]).app) as url:
            outside = await call(url + "/v1")
            sink = []
            with rollout_context("ro-1", "at-1", sink=sink.append):
                inside = await call(url + "/v1")
        print(json.dumps({
            "answers": [outside, inside],
            "owns": cap.owns_provider,
            "global": trace.get_tracer_provider() is cap.provider,
            "sampler": cap.provider.sampler.get_description(),
            "sink": [[s.name, s.rollout_id] for s in sink],
            "user_exporter": len(exporter.get_finished_spans()),
            "dropped": cap.processor.dropped,
        }))

    asyncio.run(main())
    """
)


def _run(provider: str, family: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, provider, family], capture_output=True, text=True, timeout=180, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", ["openllmetry", "openinference"])
def test_without_a_provider_capture_records_only_inside_rollouts(family: str) -> None:
    got = _run("none", family)
    assert got["answers"] == ["one", "two"]
    assert got["owns"] is True and got["global"] is True and got["sampler"] == "LightningInRolloutSampler"
    sink = got["sink"]
    assert isinstance(sink, list) and len(sink) == 1 and sink[0][1] == "ro-1"  # pyright: ignore[reportUnknownArgumentType]
    assert got["dropped"] == 0  # the call outside the rollout was never even recorded


def test_a_users_global_provider_is_reused_and_its_exporter_gets_every_span() -> None:
    got = _run("user", "openinference")
    assert got["owns"] is False and got["global"] is True
    assert got["user_exporter"] == 2  # outside the rollout and inside it
    assert got["dropped"] == 1 and len(got["sink"]) == 1  # pyright: ignore[reportArgumentType]


def test_capture_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="family must be one of"):
        capture("langsmith")  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="cannot instrument 'crewai'"):
        capture("openinference", frameworks=["crewai"])
    with pytest.raises(ImportError, match="pip install opentelemetry-instrumentation-langchain"):
        capture("openllmetry", frameworks=["openai", "langchain"])  # OpenLLMetry's LangChain one is not installed
