"""The plugins' install handle (``lightning_rl.plugins.Patches``): patch, hook, restore, and sharing.

Two plugins share clients and patch one class in every order a user can produce: random
instrument/uninstrument sequences (seeded, so a failure replays) check after each step that every
client carries exactly one routing hook while a plugin routes it and none after, that a request
goes out under the role of a plugin still routing it, and that the class is as each plugin left it.
"""

from __future__ import annotations

import random
import threading
from typing import Any, ClassVar

import httpx
import pytest

from lightning_rl.agent import LLM
from lightning_rl.plugins import (
    Instrumentor,
    Patches,
    http_client_of,
    install_hooks,
    remove_hooks,
    routed_client,
)
from lightning_rl.tracing import rollout_context

GATEWAY = "http://gateway.test/rollouts/r1/attempts/a1/key/k1/v1"


def _route_hooks(client: httpx.Client | httpx.AsyncClient) -> list[Any]:
    return [h for h in client.event_hooks.get("request", []) if getattr(h, "_lightning_route_hook", False)]


async def _sent_role(client: httpx.Client | httpx.AsyncClient) -> str | None:
    """Run ``client``'s request hooks on a request made inside a rollout; the role in the routed URL."""
    request = httpx.Request("POST", "https://api.openai.com/v1/chat/completions")
    with rollout_context("r1", "a1", llm=LLM(base_url=GATEWAY, model="m")):
        for hook in client.event_hooks.get("request", []):
            result = hook(request)
            if result is not None:
                await result
    path = request.url.path
    if not path.startswith("/rollouts/r1/attempts/a1/key/k1/"):
        return "<not routed>"
    _, _, rest = path.partition("/roles/")
    return rest.removesuffix("/v1/chat/completions") if rest else None


class Target:
    """A stand-in framework class the plugins patch."""

    def greet(self) -> str:
        return "hello"

    def shout(self) -> str:
        return "HELLO"


def test_patch_records_the_original_once_and_restore_undoes_everything_in_reverse() -> None:
    patches = Patches()
    original = Target.__dict__["greet"]
    assert patches.wrap(Target, "greet", lambda f: lambda self: f(self) + "!") is original
    assert patches.wrap(Target, "greet", lambda f: lambda self: f(self) + "?") is original  # not the wrapper
    assert Target().greet() == "hello?" and patches.is_patched(Target, "greet")
    obj = Target()
    patches.patch(obj, "shout", lambda: "instance")  # an attribute the instance did not hold
    order: list[str] = []
    patches.on_restore(lambda: order.append("first"))
    patches.on_restore(lambda: order.append("second"))
    assert obj.shout() == "instance"
    assert patches.restore() == [] and order == ["second", "first"]
    assert Target.__dict__["greet"] is original and "shout" not in vars(obj) and obj.shout() == "HELLO"
    assert patches.restore() == [] and order == ["second", "first"]  # idempotent
    assert len(patches) == 0


def test_a_failing_undo_step_does_not_stop_the_others() -> None:
    patches = Patches()
    patches.wrap(Target, "greet", lambda f: lambda self: "patched")

    def broken() -> None:
        raise RuntimeError("cannot undo")

    patches.on_restore(broken)
    [failure] = patches.restore()
    assert isinstance(failure, RuntimeError) and Target().greet() == "hello"


def test_an_exception_half_way_through_an_install_leaves_nothing_applied() -> None:
    client = httpx.Client()
    patches = Patches(role="writer")
    with pytest.raises(ValueError, match="framework changed"), patches.applying():
        patches.wrap(Target, "greet", lambda f: lambda self: "patched")
        assert patches.hook_client(client)
        raise ValueError("framework changed")
    assert Target().greet() == "hello" and _route_hooks(client) == [] and patches.hooked_clients == 0
    client.close()


class _FailingPlugin(Instrumentor):
    name = "failing"
    framework = "httpx"
    supported = ">=0.27"
    client: ClassVar[httpx.Client | None] = None

    def _instrument(self, **kwargs: Any) -> None:
        self.patches.wrap(Target, "greet", lambda f: lambda self: "patched")
        self.patches.hook_client(self.client)
        raise RuntimeError("the framework's internals moved")


def test_an_instrumentor_whose_install_fails_is_left_uninstrumented_and_unpatched() -> None:
    _FailingPlugin.client = httpx.Client()
    with pytest.raises(RuntimeError, match="internals moved"):
        _FailingPlugin().instrument(trainable=["x"])
    assert not _FailingPlugin().is_instrumented and _FailingPlugin().trainable is None
    assert Target().greet() == "hello" and _route_hooks(_FailingPlugin.client) == []
    _FailingPlugin.client.close()


def test_http_client_of_finds_the_httpx_client_under_an_openai_client() -> None:
    import openai

    http = httpx.AsyncClient()
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", http_client=http)

    class Wrapper:  # a framework's model client holding an openai client (AutoGen's)
        _client = client

    assert http_client_of(http) is http and http_client_of(Wrapper()) is client._client  # pyright: ignore[reportPrivateUsage]
    assert http_client_of(object()) is None and not Patches().hook_client(object())


async def test_two_role_sources_on_one_client_each_last_until_their_owner_lets_go() -> None:
    """The bug of the issue: a second install was ignored, and one remove took everyone's hook."""
    client = httpx.AsyncClient()

    def role_a() -> str:
        return "a"

    def role_b() -> str:
        return "b"

    assert install_hooks(client, role=role_a) and install_hooks(client, role=role_b)
    assert len(_route_hooks(client)) == 1 and await _sent_role(client) == "a"
    assert remove_hooks(client, role_a)
    assert len(_route_hooks(client)) == 1 and await _sent_role(client) == "b"  # B's routing survives A
    assert remove_hooks(client, role_b) and _route_hooks(client) == []
    assert await _sent_role(client) == "<not routed>"
    # the same through two handles (what plugins use)
    a, b = Patches(role="a"), Patches(role="b")
    assert a.hook_client(client) and b.hook_client(client) and not a.hook_client(client)
    a.restore()
    assert await _sent_role(client) == "b"
    b.restore()
    assert _route_hooks(client) == []
    await client.aclose()


async def test_a_handle_and_a_user_installed_hook_do_not_remove_each_other() -> None:
    client = routed_client(role="mine")  # the user's own routed client
    patches = Patches(role=lambda: None)  # a plugin that knows no role for this call
    assert patches.hook_client(client) and len(_route_hooks(client)) == 1
    assert await _sent_role(client) == "mine"
    patches.restore()
    assert len(_route_hooks(client)) == 1 and await _sent_role(client) == "mine"
    client.close()


def _plugin(letter: str) -> type[Instrumentor]:
    """A plugin that patches its own method of ``Target`` and routes every client it is handed."""

    def _instrument(self: Instrumentor, **kwargs: Any) -> None:
        self.patches.wrap(Target, "greet" if letter == "a" else "shout", lambda f: lambda obj: f(obj) + letter)
        self.patches.role = letter

    return type(
        f"Plugin{letter.upper()}",
        (Instrumentor,),
        {"name": f"plugin-{letter}", "framework": "httpx", "supported": ">=0.27", "_instrument": _instrument},
    )


@pytest.mark.parametrize("seed", range(40))
async def test_random_instrument_uninstrument_sequences_across_two_plugins_sharing_clients(seed: int) -> None:
    rng = random.Random(seed)
    plugins = {"a": _plugin("a")(), "b": _plugin("b")()}
    clients: list[httpx.Client | httpx.AsyncClient] = [httpx.Client(), httpx.AsyncClient(), httpx.AsyncClient()]
    routing: dict[int, list[str]] = {i: [] for i in range(len(clients))}  # client -> plugins, in arrival order
    try:
        for _ in range(25):
            letter = rng.choice("ab")
            plugin = plugins[letter]
            action = rng.choice(["instrument", "uninstrument", "hook", "hook"])
            if action == "instrument":
                plugin.instrument()
            elif action == "uninstrument":
                plugin.uninstrument()
                for users in routing.values():
                    if letter in users:
                        users.remove(letter)
            elif plugin.is_instrumented:  # a rollout reaches a client through this plugin's framework
                i = rng.randrange(len(clients))
                assert plugin.patches.hook_client(clients[i]) == (letter not in routing[i])
                if letter not in routing[i]:
                    routing[i].append(letter)
            assert Target().greet() == "hello" + ("a" if plugins["a"].is_instrumented else "")
            assert Target().shout() == "HELLO" + ("b" if plugins["b"].is_instrumented else "")
            for i, client in enumerate(clients):
                assert len(_route_hooks(client)) == (1 if routing[i] else 0)
                assert await _sent_role(client) == (routing[i][0] if routing[i] else "<not routed>")
    finally:
        for plugin in plugins.values():
            plugin.uninstrument()
    assert all(_route_hooks(c) == [] for c in clients)
    assert Target.__dict__["greet"].__qualname__ == "Target.greet"


def test_hooking_from_many_threads_adds_one_hook_per_client() -> None:
    clients = [httpx.Client() for _ in range(4)]
    handles = [Patches(role=f"r{i}") for i in range(3)]
    barrier = threading.Barrier(6)

    def worker(n: int) -> None:
        barrier.wait()
        for _ in range(50):
            for client in clients:
                handles[n % 3].hook_client(client)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(_route_hooks(c)) == 1 for c in clients) and all(h.hooked_clients == 4 for h in handles)
    for handle in handles:
        handle.restore()
    assert all(_route_hooks(c) == [] for c in clients)
    for client in clients:
        client.close()
