"""APO's pure parts: a rollout's spans rendered as a transcript, and the optimiser's prompts and replies."""

from __future__ import annotations

import json

import pytest

from lightning_rl import semconv
from lightning_rl.algorithms.apo_optimizer import critique_messages, edit_messages, extract_prompt, template_fields
from lightning_rl.algorithms.apo_render import render_rollout
from lightning_rl.types import Rollout, RolloutStatus, Span, SpanStatus, Task


def _call(
    t: int, messages: list[dict[str, str]], reply: str, tool_calls: list[dict[str, object]] | None = None
) -> Span:
    attrs: dict[str, object] = {
        semconv.GEN_AI_INPUT_MESSAGES: json.dumps(messages),
        semconv.RESPONSE_TEXT: reply,
        semconv.ROLE: "solver",
    }
    if tool_calls:
        attrs[semconv.TOOL_CALLS] = json.dumps(tool_calls)
    return Span(name=semconv.SPAN_LLM_CALL, start_ns=t, end_ns=t + 1, attributes=attrs, rollout_id="r", attempt_id="a")


def test_a_multi_turn_rollout_reads_in_order_without_repeating_the_conversation() -> None:
    system = {"role": "system", "content": "Use the calculator."}
    user = {"role": "user", "content": "What is 6 x 7?"}
    call = {"id": "call_1", "name": "calc", "arguments": {"expr": "6*7"}}
    spans = [
        # out of order on purpose: the transcript follows start times
        _call(30, [system, user, {"role": "tool", "content": "error: bad expression"}], "I could not compute it."),
        _call(10, [system, user], "", [call]),
        Span(
            name=semconv.SPAN_TOOL,
            start_ns=20,
            attributes={semconv.GEN_AI_TOOL_NAME: "calc", semconv.TOOL_STATUS: "error", semconv.TOOL_ERROR: "bad"},
            status=SpanStatus(code="error"),
            rollout_id="r",
            attempt_id="a",
        ),
        Span(
            name=semconv.SPAN_SIGNAL,
            start_ns=21,
            attributes={semconv.SIGNAL_NAME: "tool_error", semconv.SIGNAL_VALUE: 1.0},
            rollout_id="r",
            attempt_id="a",
        ),
    ]
    rollout = Rollout(task=Task(input={"q": "6 x 7"}), status=RolloutStatus.SUCCEEDED)
    text = render_rollout(rollout, spans, reward=0.0)
    lines = text.splitlines()
    assert lines[0] == 'task: {"q": "6 x 7"}'
    assert text.count("Use the calculator.") == 1 and text.count("What is 6 x 7?") == 1  # resent messages once
    order = [
        "[model call (role solver)]",
        "tool call:",
        "[tool calc] status error: bad",
        "[signal tool_error] 1.0",
        "tool: error: bad expression",
        "assistant: I could not compute it.",
    ]
    positions = [text.index(p) for p in order]
    assert positions == sorted(positions)
    assert lines[-2:] == ["outcome: succeeded", "reward: 0.000"]


def test_calls_captured_by_an_opentelemetry_instrumentation_are_in_the_transcript() -> None:
    """A hosted model's calls reach the store only as the instrumentation's spans (docs/capture.md);
    APO critiques them like the gateway's (span attributes as OpenLLMetry writes them)."""
    captured = Span(
        name="openai.chat",
        start_ns=5,
        end_ns=9,
        attributes={
            "llm.request.type": "chat",
            "gen_ai.request.model": "hosted-model",
            "gen_ai.response.id": "chatcmpl-9",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "What is 2 + 2?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "Five.",
        },
        rollout_id="r",
        attempt_id="a",
    )
    rollout = Rollout(task=Task(input={"q": "2 + 2"}), status=RolloutStatus.SUCCEEDED)
    text = render_rollout(rollout, [captured, _call(20, [{"role": "user", "content": "Sure?"}], "Yes.")], reward=0.0)
    assert "user: What is 2 + 2?" in text and "assistant: Five." in text
    assert text.index("assistant: Five.") < text.index("assistant: Yes.")  # in time order with the gateway's


def test_long_texts_are_cut_and_errors_shown() -> None:
    rollout = Rollout(task=Task(input="x" * 50), status=RolloutStatus.FAILED, error="Traceback: boom")
    text = render_rollout(rollout, [_call(1, [{"role": "user", "content": "y" * 500}], "z")], text_limit=100)
    assert "y" * 100 + " [... 400 more characters]" in text
    assert "outcome: failed" in text and "error: Traceback: boom" in text and "reward:" not in text


def test_the_optimiser_prompts_carry_the_template_failures_and_placeholders() -> None:
    template = "Answer {question} in {style}. Literal braces: {{x}}."
    assert template_fields(template) == {"question", "style"}
    assert template_fields("a stray { brace") == frozenset()
    critique = critique_messages(template, ["transcript one", "transcript two"])[1]["content"]
    assert template in critique and "--- transcript 2 ---\ntranscript two" in critique
    edit = edit_messages(template, "Be shorter.")[1]["content"]
    assert "Be shorter." in edit and "{question}, {style}" in edit and "<prompt>" in edit


def test_the_new_prompt_is_read_from_the_reply() -> None:
    assert extract_prompt("Here it is:\n<prompt>\nBe brief.\n</prompt>\nGood luck") == "Be brief."
    assert extract_prompt("<prompt>draft</prompt> better: <PROMPT>final</PROMPT>") == "final"
    assert extract_prompt("<prompt>unclosed until the end") == "unclosed until the end"
    assert extract_prompt("  no tags at all  ") == "no tags at all"


async def test_the_optimiser_client_retries_a_busy_endpoint_and_reports_a_refusal() -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from lightning_rl.algorithms.apo_optimizer import OptimizerClient, OptimizerError
    from lightning_rl.gateway import running_gateway

    calls: list[str] = []

    async def chat(request: Request) -> JSONResponse:
        """A test double of a chat endpoint: busy (503) on the first call, then answers; 401 for a bad key."""
        calls.append(request.headers.get("authorization", ""))
        if request.headers.get("authorization") != "Bearer right":
            return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
        if len(calls) == 1:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        body = await request.json()
        return JSONResponse(
            {"choices": [{"message": {"role": "assistant", "content": f"<prompt>{body['model']}</prompt>"}}]}
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    async with running_gateway(app) as url:
        client = OptimizerClient(f"{url}/v1", "m1", api_key="right", retries=2)
        try:
            edit = await client.edit("old", ["failure"])
        finally:
            await client.aclose()
        assert edit == type(edit)(template="m1", critique="<prompt>m1</prompt>")
        assert len(calls) == 3 and client.calls == 2  # one 503 retried, then critique and edit
        bad = OptimizerClient(f"{url}/v1", "m1", api_key="wrong")
        try:
            with pytest.raises(OptimizerError, match=r"401.*invalid api key.*API key"):
                await bad.chat([{"role": "user", "content": "hi"}])
        finally:
            await bad.aclose()
        assert len(calls) == 4  # a refusal is not retried
