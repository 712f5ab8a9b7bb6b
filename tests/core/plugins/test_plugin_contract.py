"""The plugin contract in core: instrumentor lifecycle, routing to the rollout's gateway, role and tool spans."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from lightning_rl import semconv
from lightning_rl.adapter import air_policy
from lightning_rl.errors import IncompatibleFrameworkError
from lightning_rl.plugins import (
    Instrumentor,
    PluginFailures,
    acting_as,
    current_route,
    declared_trainable,
    guarded,
    install_hooks,
    load_plugin,
    record_role,
    record_tool,
    remove_hooks,
    routed_async_client,
    routed_client,
    version_in_range,
)
from lightning_rl.testing import FakeReply, FakeToolCall, GatewayHarness

MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("1.7.2", ">=1.0,<2", True),
        ("2.0", ">=1.0,<2", False),
        ("0.20.0", ">=0.20", True),
        ("0.24.1rc1", ">=0.20,<0.25", True),
        ("1.15.30", "==1.15.30", True),
        ("1.15", "!=1.15.0", False),
        ("0.7.5", ">0.7.5", False),
    ],
)
def test_version_range(version: str, spec: str, ok: bool) -> None:
    assert version_in_range(version, spec) is ok


def test_bad_version_range_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="'~1.0'"):
        version_in_range("1.0", "~1.0")


class _CountingInstrumentor(Instrumentor):
    """A minimal plugin over httpx (always installed) that counts its hook calls."""

    name = "counting"
    framework = "httpx"
    supported = ">=0.27"
    patched = 0
    unpatched = 0

    def _instrument(self, **kwargs: Any) -> None:
        type(self).patched += 1

    def _uninstrument(self) -> None:
        type(self).unpatched += 1


class _TooNew(_CountingInstrumentor):
    name = "too-new"
    supported = "<0.1"


class _Missing(_CountingInstrumentor):
    name = "missing"
    framework = "no-such-framework-dist"


def test_instrument_is_idempotent_and_a_singleton() -> None:
    plugin = _CountingInstrumentor()
    assert _CountingInstrumentor() is plugin
    before = _CountingInstrumentor.patched
    plugin.instrument(trainable=["writer"])
    plugin.instrument(trainable=["other"])  # ignored: already instrumented
    assert _CountingInstrumentor.patched == before + 1
    assert plugin.is_instrumented and plugin.is_trainable("writer") and not plugin.is_trainable("other")
    plugin.uninstrument()
    plugin.uninstrument()
    assert _CountingInstrumentor.unpatched == 1 and not plugin.is_instrumented
    assert plugin.is_trainable("writer") is None  # no selection once uninstrumented


def test_unsupported_or_missing_framework_is_refused_before_patching() -> None:
    with pytest.raises(IncompatibleFrameworkError, match="supports httpx<0.1") as info:
        _TooNew().instrument()
    assert isinstance(info.value, ImportError) and "check_version=False" in str(info.value)
    assert not _TooNew().is_instrumented
    with pytest.raises(IncompatibleFrameworkError, match="pip install 'no-such-framework-dist"):
        _Missing().instrument()
    _TooNew().instrument(check_version=False)
    assert _TooNew().is_instrumented
    _TooNew().uninstrument()


def test_unknown_plugin_names_the_install_command() -> None:
    with pytest.raises(LookupError, match="pip install lightning-nope"):
        load_plugin("nope")


def test_guarded_swallows_and_counts_plugin_failures() -> None:
    @guarded
    def broken() -> int:
        raise RuntimeError("plugin bug")

    before = PluginFailures.count
    assert broken() is None
    assert PluginFailures.count == before + 1 and isinstance(PluginFailures.last, RuntimeError)


async def test_routing_sends_a_foreign_base_url_to_the_attempt_and_leaves_other_calls_alone() -> None:
    async with GatewayHarness(script=["routed", "plain"]) as h:
        # The framework's client points at OpenAI with a user key and another model name.
        client = openai.AsyncOpenAI(
            base_url="https://api.openai.com/v1", api_key="sk-user", http_client=routed_async_client(role="writer")
        )
        async with h.attempt() as claim:
            route = current_route()
            assert route is not None and route.rollout_id == claim.rollout.id
            r = await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        assert r.choices[0].message.content == "routed"
        # Outside any rollout the request goes where the client points (here: the plain gateway URL).
        plain = openai.AsyncOpenAI(base_url=h.v1, api_key="k", http_client=routed_async_client(role="writer"))
        assert current_route() is None
        r2 = await plain.chat.completions.create(model=h.model, messages=MESSAGES)
        assert r2.choices[0].message.content == "plain"
        spans = await h.spans(claim)
        [call] = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        assert call.attributes[semconv.ROLE] == "writer" and call.rollout_id == claim.rollout.id
        all_calls = await h.store.query_spans()
        assert sum(s.name == semconv.SPAN_LLM_CALL for s in all_calls) == 1  # the plain call belongs to no rollout
        await client.close()
        await plain.close()


async def test_hooks_on_an_existing_client_install_once_and_remove_cleanly() -> None:
    async with GatewayHarness(script=["a", "b"]) as h:
        sync_http = routed_client()
        assert not install_hooks(sync_http)  # routed_client already carries the hook
        client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k")
        http = client._client  # pyright: ignore[reportPrivateUsage] - what plugins patch on a user's client
        assert install_hooks(http) and not install_hooks(http)
        async with h.attempt() as claim:
            r = await client.chat.completions.create(model="any", messages=MESSAGES)
        assert r.choices[0].message.content == "a"
        assert remove_hooks(http) and not remove_hooks(http)
        assert len([s for s in await h.spans(claim) if s.name == semconv.SPAN_LLM_CALL]) == 1
        sync_http.close()
        await client.close()


async def test_acting_as_attributes_concurrent_rollouts_exactly() -> None:
    roles = ["planner", "writer", "critic", "writer"] * 2

    async with GatewayHarness(responder=lambda body: f"for {body['messages'][-1]['content']}") as h:
        client = openai.AsyncOpenAI(
            base_url="https://example.invalid/v1", api_key="k", http_client=routed_async_client()
        )

        async def one(i: int, role: str) -> tuple[Any, str]:
            async with h.attempt(task_input=i) as claim:
                with acting_as(role):
                    await asyncio.sleep(0.001 * (8 - i))  # interleave the rollouts
                    r = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"{i}"}])
            assert r.choices[0].message.content == f"for {i}"
            return claim, role

        done = await asyncio.gather(*(one(i, role) for i, role in enumerate(roles)))
        for claim, role in done:
            adapted = await h.adapt(claim)
            assert [t.role for t in adapted.transitions] == [role]
        await client.close()


async def test_role_spans_join_on_response_id_and_trainable_declarations_filter() -> None:
    script = [FakeReply(tool_calls=[FakeToolCall("execute_sql", {"q": "x"})]), "checked", "final"]
    async with GatewayHarness(script=script) as h:
        client = openai.AsyncOpenAI(
            base_url="https://example.invalid/v1", api_key="k", http_client=routed_async_client()
        )
        async with h.attempt() as claim:
            r1 = await client.chat.completions.create(model="m", messages=MESSAGES)
            record_role("writer", response_id=r1.id, trainable=True)
            [call] = r1.choices[0].message.tool_calls or []
            record_tool("execute_sql", call_id=call.id, role="writer", error=ValueError("no such table"))
            r2 = await client.chat.completions.create(model="m", messages=MESSAGES)
            record_role("checker", response_id=r2.id, trainable=False)
            r3 = await client.chat.completions.create(model="m", messages=MESSAGES)
            record_role("writer", response_id=r3.id, trainable=True)
            record_tool("lookup", role="writer", output="ok")  # no call id: latest call of the role
        policy = air_policy(tool_error=-0.1, tool_success=0.05, per_tool={"execute_sql": -0.5})
        adapted = await h.adapt(claim, air=policy)
        assert [t.role for t in adapted.transitions] == ["writer", "writer"]
        assert adapted.n_untrainable == 1
        assert [t.reward for t in adapted.transitions] == [pytest.approx(-0.5), pytest.approx(0.05)]
        # an explicit trainer selection overrides the declarations
        every = await h.adapt(claim, trainable="all")
        assert [t.role for t in every.transitions] == ["writer", "checker", "writer"]
        tool_spans = [s for s in await h.spans(claim) if s.name == semconv.SPAN_TOOL]
        assert tool_spans[0].status.code == "error" and "no such table" in tool_spans[0].attributes[semconv.TOOL_ERROR]
        assert tool_spans[1].attributes["lightning.tool.joined_by"] == "latest_call_of_role"
        assert tool_spans[0].attributes[semconv.GEN_AI_TOOL_NAME] == "execute_sql"
        await client.close()


async def test_a_tool_error_the_role_recovers_from_has_its_own_air_weight() -> None:
    """A failed lookup that the same role follows with a successful lookup (a misspelt name, then the
    suggested one) is weighed by ``tool_error_recovered``; an error never recovered, or recovered by
    another role or another tool, stays a ``tool_error``. Without the key both weigh the same."""
    script = ["looked up a misspelling", "looked up the suggestion", "gave up", "asked another tool"]
    async with GatewayHarness(script=script) as h:
        client = openai.AsyncOpenAI(
            base_url="https://example.invalid/v1", api_key="k", http_client=routed_async_client()
        )
        async with h.attempt() as claim:
            for text in script:
                r = await client.chat.completions.create(model="m", messages=MESSAGES)
                record_role("researcher" if text != "gave up" else "writer", response_id=r.id, trainable=True)
                if text == "looked up a misspelling":
                    record_tool("lookup", role="researcher", error=KeyError("pink-desk: did you mean 'pink desk'?"))
                elif text == "looked up the suggestion":
                    record_tool("lookup", role="researcher", output="26 euros")
                elif text == "gave up":
                    record_tool("lookup", role="writer", error=KeyError("no such item"))
                else:
                    record_tool("calculator", role="researcher", output="2")
        adapted = await h.adapt(claim, air=air_policy(tool_error=-0.1, tool_error_recovered=0.0))
        assert [t.reward for t in adapted.transitions] == [0.0, 0.0, pytest.approx(-0.1), 0.0]
        recovered = [s.recovered for s in adapted.signals if s.name == "tool_error"]
        assert recovered == [True, False]
        per_tool = await h.adapt(claim, air={"tool_error": -0.1, "tool_error_recovered:lookup": -0.02})
        assert [t.reward for t in per_tool.transitions] == [pytest.approx(-0.02), 0.0, pytest.approx(-0.1), 0.0]
        plain = await h.adapt(claim, air=air_policy(tool_error=-0.1))
        assert [t.reward for t in plain.transitions] == [pytest.approx(-0.1), 0.0, pytest.approx(-0.1), 0.0]
        await client.close()


def test_recording_outside_a_rollout_is_a_no_op() -> None:
    assert record_role("writer", response_id="r") is None
    assert record_tool("t", error="boom") is None


async def test_calls_without_a_role_stay_out_once_a_plugin_declared_roles() -> None:
    async with GatewayHarness(script=["planned", "written"]) as h:
        client = openai.AsyncOpenAI(
            base_url="https://example.invalid/v1", api_key="k", http_client=routed_async_client()
        )
        async with h.attempt() as claim:
            await client.chat.completions.create(model="m", messages=MESSAGES)  # e.g. a crew's planner: no role
            r = await client.chat.completions.create(model="m", messages=MESSAGES)
            record_role("writer", response_id=r.id, trainable=True)
        adapted = await h.adapt(claim)
        assert [t.role for t in adapted.transitions] == ["writer"] and adapted.n_untrainable == 1
        assert len((await h.adapt(claim, trainable="all")).transitions) == 2
        await client.close()


@pytest.mark.parametrize("role", ["Sales/Marketing Lead", "Rédacteur en chef", "senior writer"])
async def test_free_text_roles_are_routed_and_recorded_exactly(role: str) -> None:
    """CrewAI roles and agent names are free text: slashes, spaces and non-ASCII included."""
    async with GatewayHarness(script=["ok"]) as h:
        client = openai.AsyncOpenAI(
            base_url="https://example.invalid/v1", api_key="k", http_client=routed_async_client(role=role)
        )
        async with h.attempt() as claim:
            r = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert r.choices[0].message.content == "ok"
        [call] = [s for s in await h.spans(claim) if s.name == semconv.SPAN_LLM_CALL]
        assert call.attributes[semconv.ROLE] == role
        await client.close()


async def test_marking_one_role_untrainable_leaves_the_undeclared_ones_trained() -> None:
    async with GatewayHarness(script=["draft", "check"]) as h:
        client = openai.AsyncOpenAI(
            base_url="https://example.invalid/v1", api_key="k", http_client=routed_async_client()
        )
        async with h.attempt() as claim:
            with acting_as("draft"):
                await client.chat.completions.create(model="m", messages=MESSAGES)
            r = await client.chat.completions.create(model="m", messages=MESSAGES)
            record_role("checker", response_id=r.id, trainable=False)
        adapted = await h.adapt(claim)
        assert [t.role for t in adapted.transitions] == ["draft"] and adapted.n_untrainable == 1
        await client.close()


def test_a_plugin_whose_framework_is_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    from lightning_rl.plugins import registry

    ghost = metadata.EntryPoint(
        name="ghost", value="no_such_framework_module_xyz:Ghost", group=registry.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(registry, "available_plugins", lambda: {"ghost": ghost})
    with pytest.raises(IncompatibleFrameworkError, match=r"pip install 'lightning-ghost\[ghost\]'"):
        load_plugin("ghost")
    [info] = registry.describe_plugins()  # listed, not raised: one broken plugin hides no other
    assert info.name == "ghost" and not info.ok and "cannot load" in info.framework


class _Other(_CountingInstrumentor):
    name = "other"


def test_declared_trainable_combines_the_instrumented_plugins_selections() -> None:
    one, other = _CountingInstrumentor(), _Other()
    assert declared_trainable("writer") is None  # nothing instrumented: the trainer decides
    one.instrument(trainable=["writer"])
    try:
        assert declared_trainable("writer") is True
        assert declared_trainable("critic") is False  # a role was named trainable: the rest are not
        assert declared_trainable(None) is False
        other.instrument(trainable=["critic"])
        try:
            assert declared_trainable("critic") is True  # either plugin's selection counts
            assert declared_trainable("planner") is False
        finally:
            other.uninstrument()
        other.instrument()  # instrumented without a selection: says nothing
        try:
            assert declared_trainable("critic") is False
        finally:
            other.uninstrument()
    finally:
        one.uninstrument()
    assert declared_trainable("writer") is None
