"""The ``logprobs`` mode against our own gateway serving the tiny model: the request it sends
(``max_tokens=1``, ``logprobs``, ``top_logprobs=20``, the judge's chat messages) is one the gateway
takes, and the answer has the shape ``digit_score`` reads. The tiny model is no judge: the scores are
not checked, only that every try ends in a score in [0, 1] or a ``malformed`` answer (no digit among
its top tokens), never in a request error. SmolLM2's real check is ``benchmarks/offline_judge.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

pytest.importorskip("torch")

from lightning_rl.engine.hf import TransformersEngine  # noqa: E402
from lightning_rl.engine.tiny import default_tiny_model  # noqa: E402
from lightning_rl.gateway import create_gateway_app  # noqa: E402
from lightning_rl.gateway.server import running_gateway  # noqa: E402
from lightning_rl.rewards import (  # noqa: E402
    TOP_LOGPROBS,
    GroupJudge,
    JudgeAnswerError,
    JudgeConfig,
    digit_messages,
    digit_score,
)

TEXTS = ["task: What is 2 plus 3?\nassistant: The answer is 5.", "task: What is 2 plus 3?\nassistant: It is 7."]


@pytest.fixture
async def tiny_gateway() -> AsyncIterator[tuple[str, str]]:
    with TransformersEngine.from_pretrained(default_tiny_model(), max_batch_size=4) as engine:
        async with running_gateway(create_gateway_app(engine)) as url:
            yield f"{url}/v1", engine.model_name


async def test_the_gateway_answers_a_digit_request_with_top_logprobs(tiny_gateway: tuple[str, str]) -> None:
    url, model = tiny_gateway
    body = {
        "model": model,
        "messages": digit_messages("Right answers score high.", TEXTS[0]),
        "temperature": 0.0,
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": TOP_LOGPROBS,
    }
    async with httpx.AsyncClient(timeout=60) as client:
        response = await client.post(f"{url}/chat/completions", json=body)
    assert response.status_code == 200, response.text
    completion = response.json()
    (first,) = completion["choices"][0]["logprobs"]["content"]  # one token
    assert len(first["top_logprobs"]) == TOP_LOGPROBS
    assert all(isinstance(e["token"], str) and e["logprob"] <= 0 for e in first["top_logprobs"])
    try:
        assert 0.0 <= digit_score(completion) <= 1.0
    except JudgeAnswerError as exc:
        assert exc.kind == "malformed"

    config = JudgeConfig(model=model, base_url=url, scoring="logprobs", max_retries=0, cache=False, timeout_s=60)
    judge = GroupJudge(config)
    (scores,) = await judge.score_groups([TEXTS])
    assert judge.stats.calls == 2 and judge.stats.completion_tokens == 2
    assert set(judge.stats.errors) <= {"malformed"}
    assert scores is None or all(0.0 <= s <= 1.0 for s in scores)
