"""A real store and a real gateway for testing a framework plugin, without a trainer or a model.

``GatewayHarness`` runs the Lightning gateway (the real app, over HTTP on 127.0.0.1) in front of a
:class:`FakeUpstream` (the only double: it stands in for vLLM so no model is needed), writes every
call to a real ``MemoryStore``, and opens rollout attempts the way the runner does. A plugin test
then runs its framework's agents inside ``harness.attempt()`` contexts, concurrently if it likes,
and checks the transitions the adapter builds from what was recorded::

    async with GatewayHarness(responder=reply_for) as h:
        async def one(i):
            async with h.attempt(task_input=i) as claim:
                await graph.ainvoke(...)             # the user's code, unchanged
            return await h.adapt(claim, air={"tool_error": -1.0})
        results = await asyncio.gather(*(one(i) for i in range(8)))
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from lightning_rl.adapter import AdaptedAttempt, AIRPolicy, adapt_attempt
from lightning_rl.agent import LLM
from lightning_rl.roles import RoleSelector, RoleSpec
from lightning_rl.store import MemoryStore
from lightning_rl.testing.fake_upstream import FakeReply, FakeUpstream
from lightning_rl.tracing import rollout_context
from lightning_rl.types import Claim, LLMResource, RolloutRequest, Span, Task

__all__ = ["GatewayHarness"]


class GatewayHarness:
    """Store + gateway + fake upstream, started by ``async with``.

    Args:
        responder: Reply to each upstream request from its body (see ``FakeUpstream``).
        script: Replies in arrival order, when no responder is given.
        model: The served model name.
        upstream: Use this fake instead of building one.
    """

    def __init__(
        self,
        responder: Callable[[dict[str, Any]], FakeReply | str] | None = None,
        *,
        script: Sequence[FakeReply | str] = (),
        model: str = "fake-model",
        upstream: FakeUpstream | None = None,
    ) -> None:
        self.upstream = upstream or FakeUpstream(script, model=model, responder=responder)
        self.model = self.upstream.model
        self.store = MemoryStore()
        self.url = ""
        self._app: Any = None
        self._stack = AsyncExitStack()
        self._plugin_spans: list[Span] = []

    async def __aenter__(self) -> GatewayHarness:
        from lightning_rl.gateway import UpstreamBackend, create_gateway_app, running_gateway

        up = await self._stack.enter_async_context(running_gateway(self.upstream.app))
        self._app = create_gateway_app(UpstreamBackend(f"{up}/v1"), store=self.store)
        self.url = await self._stack.enter_async_context(running_gateway(self._app))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()
        await self.store.close()

    @property
    def v1(self) -> str:
        """The gateway's plain OpenAI base URL (calls outside any rollout)."""
        return f"{self.url}/v1"

    def llm(self, claim: Claim) -> LLM:
        """The ``LLM`` the runner would hand the agent for ``claim``."""
        resource = LLMResource(base_url=self.url, model=self.model)
        return LLM.for_attempt(resource, claim.rollout.id, claim.attempt.id, key=claim.attempt.gateway_key)

    async def new_attempt(self, task_input: Any = None) -> Claim:
        """Enqueue one rollout and claim it: an open attempt, as a runner holds it."""
        [rollout] = await self.store.enqueue([RolloutRequest(task=Task(input=task_input))])
        claims = await self.store.claim("harness")
        if len(claims) != 1 or claims[0].rollout.id != rollout.id:
            raise RuntimeError("the harness store handed out an unexpected claim; use one harness per test.")
        return claims[0]

    def attempt(self, task_input: Any = None) -> AbstractAsyncContextManager[Claim]:
        """Open an attempt and run the block inside its rollout context (plugins see it)."""
        return self._attempt(task_input)

    @asynccontextmanager
    async def _attempt(self, task_input: Any) -> AsyncGenerator[Claim]:
        claim = await self.new_attempt(task_input)
        with rollout_context(
            claim.rollout.id,
            claim.attempt.id,
            sink=self._plugin_spans.append,
            task=claim.rollout.task,
            llm=self.llm(claim),
        ):
            yield claim

    async def spans(self, claim: Claim) -> list[Span]:
        """Everything recorded for ``claim``'s attempt: the gateway's calls and the plugin's spans."""
        assert self._app is not None, "use the harness inside 'async with'"
        if not await self._app.state.gateway.writer.flush(10.0):
            raise TimeoutError("the gateway's span writer did not flush within 10 s")
        mine = [s for s in self._plugin_spans if s.attempt_id == claim.attempt.id]
        if mine:
            await self.store.add_spans(mine)
        return [
            s for s in await self.store.query_spans(rollout_id=claim.rollout.id) if s.attempt_id == claim.attempt.id
        ]

    async def adapt(
        self, claim: Claim, *, trainable: RoleSpec | RoleSelector = None, air: AIRPolicy | None = None
    ) -> AdaptedAttempt:
        """The adapter's view of ``claim``'s attempt: transitions with roles and AIR rewards."""
        return adapt_attempt(claim.rollout, claim.attempt.id, await self.spans(claim), trainable=trainable, air=air)
