"""RL on captured calls: ``retokenize`` builds token ids with the policy's tokenizer and says so.

The tokenizer is the tiny model's (a Qwen2 tokenizer with a chat template, built locally); the
transitions come from a real capture of the OpenAI client against the hosted fake endpoint.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.capture import retokenize, template_message
from lightning_rl.gateway import running_gateway
from lightning_rl.testing import FakeUpstream
from lightning_rl.types import Transition

from .conftest import captured
from .test_client import agent, reply_for

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from lightning_rl.engine.tiny import default_tiny_model

    path: Path = default_tiny_model()
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture
async def transitions() -> AsyncIterator[list[Transition]]:
    upstream = FakeUpstream(responder=reply_for)
    async with running_gateway(upstream.app) as url, captured("openinference") as c:
        claim, _ = await c.run(lambda: agent(f"{url}/v1", stream=False))
        yield (await c.adapt(claim)).transitions


async def test_retokenize_renders_each_call_with_the_policys_chat_template(
    tokenizer: Any, transitions: list[Transition]
) -> None:
    assert [len(t.response_ids) for t in transitions] == [0, 0, 0]
    assert retokenize(transitions, tokenizer, name="tiny-qwen2") == 3
    for t in transitions:
        assert t.text is not None and t.text.retokenized_with == "tiny-qwen2"
        assert not t.exact_tokens and t.response_logprobs is None
        messages = [template_message(m) for m in t.text.messages]
        prompt = tokenizer.apply_chat_template(messages, tools=t.text.tools, add_generation_prompt=True, tokenize=False)
        assert t.prompt_ids == tokenizer.encode(prompt, add_special_tokens=False)
        response = tokenizer.decode(t.response_ids)
        assert response.endswith("<|im_end|>\n")  # the turn's end is trained too
        if t.text.response:
            assert response.startswith(t.text.response)
    tool_call, answer, _ = transitions
    assert "<tool_call>" in tokenizer.decode(tool_call.response_ids) and '"add"' in tokenizer.decode(
        tool_call.response_ids
    )
    assert "<tools>" in tokenizer.decode(tool_call.prompt_ids)  # the tool definitions the call was offered
    assert answer.text and "the sum is 5" in tokenizer.decode(answer.response_ids)
    # already tokenized transitions are left alone
    before = [list(t.response_ids) for t in transitions]
    assert retokenize(transitions, tokenizer) == 0
    assert [t.response_ids for t in transitions] == before


def test_retokenize_needs_a_chat_template(tokenizer: Any, transitions: list[Transition]) -> None:
    class NoTemplate:
        chat_template = None

    assert retokenize([], NoTemplate()) == 0  # nothing to tokenize: no tokenizer needed
    with pytest.raises(ValueError, match="chat template"):
        retokenize(transitions, NoTemplate())
