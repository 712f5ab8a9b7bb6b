"""The tiny-model kit builds an ordinary HF folder that the standard Auto* loaders read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_rl.engine.tiny import TinyModelConfig, build_tiny_model, default_tiny_model
from lightning_rl.engine.toolcalls import parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def test_folder_loads_through_auto_classes(tiny_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert model.config.model_type == "qwen2"
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert 500_000 < sum(p.numel() for p in model.parameters()) < 5_000_000
    assert 1000 <= len(tokenizer) <= 4096
    assert tokenizer.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert tokenizer.pad_token == "<|endoftext|>"
    assert set(tokenizer.all_special_tokens) == {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
    # Markers are single tokens; tool markers survive decoding, chat markers do not.
    for marker in ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]:
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1
    ids = tokenizer.encode("<|im_start|>hi<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hi<tool_call>{}</tool_call>"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer)) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! What is 12 * (3 + 4)?",
        '{"a": [1, 2.5, null], "b": "x"}',
        "héllo wörld 😀 日本",
        "  tabs\tand\n\nlines ",
    ],
)
def test_tokenizer_round_trips_any_text(tiny_path: Path, text: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text


def test_build_is_deterministic_and_sized_by_knobs(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a", seed=3, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)
    b = build_tiny_model(tmp_path / "b", seed=3, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128)
    ma, mb = AutoModelForCausalLM.from_pretrained(a), AutoModelForCausalLM.from_pretrained(b)
    assert ma.config.hidden_size == 64 and ma.config.num_hidden_layers == 2
    for (name, pa), (_, pb) in zip(ma.state_dict().items(), mb.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_llama_architecture(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "llama", architecture="llama", hidden=64, layers=2, heads=2, kv_heads=1)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert model.config.model_type == "llama"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_bad_sizes_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tmp_path / "bad", hidden=100, heads=3)


def test_default_tiny_model_is_cached_by_config(tmp_path: Path) -> None:
    knobs = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64}
    first = default_tiny_model(tmp_path, **knobs)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert default_tiny_model(tmp_path, **knobs) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    assert first.name == f"tiny-{TinyModelConfig(**knobs).key()}"  # type: ignore[arg-type]
    assert default_tiny_model(tmp_path, **{**knobs, "seed": 1}) != first
    assert json.loads((first / "lightning_tiny.json").read_text())["hidden"] == 32
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tiny-")]  # no staging left behind


def test_an_extra_corpus_teaches_the_tokenizer_an_agents_prompt_text(tmp_path: Path) -> None:
    """A framework's boilerplate costs about a token per word once the tokenizer has seen it; names left
    out of the extra text are still spelt in small pieces, and a model without extra text keeps its key."""
    boiler = "This is the expected criteria for your final answer: you MUST return the actual complete content."
    knobs = {"hidden": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64}
    plain = AutoTokenizer.from_pretrained(default_tiny_model(tmp_path, **knobs))
    taught = AutoTokenizer.from_pretrained(default_tiny_model(tmp_path, **knobs, extra_corpus=(boiler,) * 50))
    assert len(taught.encode(boiler)) <= len(boiler.split()) + 4 < len(plain.encode(boiler))
    for text in ("teal kettle", "vok-trisa 4321"):  # not in the extra text: still spelt in small pieces
        assert len(taught.encode(text)) >= len(text) // 2
    assert TinyModelConfig(**knobs).key() == TinyModelConfig(**knobs, extra_corpus=()).key()  # type: ignore[arg-type]
    with_list = default_tiny_model(tmp_path, **knobs, extra_corpus=[boiler] * 50)  # a list is taken as a tuple
    assert with_list.name == f"tiny-{TinyModelConfig(**knobs, extra_corpus=(boiler,) * 50).key()}"  # type: ignore[arg-type]


def test_chat_template_renders_tools_and_round_trips_calls(tiny_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 6 * 7?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "1"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text.startswith(
        "<|im_start|>system\nBe brief.\n<tools>\ncalculator(expression: string) - Evaluate an arithmetic expression.\n"
        "</tools><|im_end|>\n"
    )
    assert "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n" in text
    assert "<|im_start|>tool\n42<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    # The assistant turn parses back to the same calls.
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = parse_tool_calls(turn)
    assert parsed.parse_error is None and parsed.content is None
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("calculator", {"expression": "6 * 7"}),
        ("calculator", {"expression": "1"}),
    ]
    # Chat text encodes with the markers as single tokens and decodes back exactly.
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_chat_template_without_tools_or_system(tiny_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert text == "<|im_start|>user\nab<|im_end|>\n"
    only_tools = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tools=TOOLS, add_generation_prompt=False, tokenize=False
    )
    assert only_tools.startswith("<|im_start|>system\n<tools>\ncalculator(expression: string)")
