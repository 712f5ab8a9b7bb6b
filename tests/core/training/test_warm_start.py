"""The shared warm start: chat demonstrations rendered with the engine's template, SFT, an HF folder out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import AutoModelForCausalLM

from lightning_rl.trainer.warm_start import sft_on_chats

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


def _colour_demos() -> tuple[list[Any], list[Any]]:
    """(expert, sloppy) demonstrations for the staged warm start: the expert calls its tool first, the
    sloppy one answers from memory."""

    def ask(w: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"colour {w}"}]

    words = ("red", "blue", "green", "gold", "grey", "pink")
    expert = [(ask(w), TOOLS, f'<tool_call>{{"name": "add", "arguments": {{}}}}</tool_call>{w}') for w in words]
    return expert, [(ask(w), TOOLS, f"it is {w}") for w in words]


def test_sft_on_chats_lowers_the_loss_and_saves_a_loadable_model(tmp_path: Path, tiny_model_path: Path) -> None:
    demos = [
        ([{"role": "user", "content": f"say {w}"}], None, f"{w} {w}") for w in ("red", "blue", "green", "gold")
    ] + [([{"role": "user", "content": "add them"}], TOOLS, "I will add.")]
    done = sft_on_chats(tiny_model_path, tmp_path / "ws", demos, steps=30, seed=0, batch_size=4)
    assert done.n_examples == 5 and len(done.losses) == 30
    assert sum(done.losses[-5:]) < sum(done.losses[:5])
    assert AutoModelForCausalLM.from_pretrained(done.model_dir) is not None


def test_the_warm_starts_load_no_engine_beside_the_model_they_train(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts come from the tokenizer (``ChatPrompts``): an engine would hold a second copy of the
    weights through the whole warm start (270 MB for SmolLM2 in bfloat16)."""
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.trainer.staged_warm_start import StagedWarmStartConfig, staged_warm_start

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a warm start built an inference engine")

    monkeypatch.setattr(TransformersEngine, "__init__", refuse)
    demos = [([{"role": "user", "content": "add them"}], TOOLS, "I will add.")]
    assert sft_on_chats(tiny_model_path, tmp_path / "sft", demos, steps=2, batch_size=1).n_examples == 1
    expert, sloppy = _colour_demos()
    config = StagedWarmStartConfig(expert_steps=2, probe_every=2, polish_steps=1, habit_steps=1, habit_min_steps=1,
                                   batch_size=2, progress=False)  # fmt: skip
    done = staged_warm_start(
        tiny_model_path, tmp_path / "staged", expert=expert, sloppy=sloppy, probes={}, habit_prompts=[], config=config
    )
    assert (done.model_dir / "config.json").exists()


def test_no_demonstrations_is_a_clear_error(tmp_path: Path, tiny_model_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one example"):
        sft_on_chats(tiny_model_path, tmp_path / "ws", [], steps=1)


def test_the_staged_warm_start_forms_the_skill_then_the_habit(tmp_path: Path, tiny_model_path: Path) -> None:
    """Phase 1 stops once greedy decoding reproduces the probes; the habit phase then drives the
    policy's first-token probability of the tool call down below its target."""
    from lightning_rl.trainer.staged_warm_start import StagedWarmStartConfig, staged_warm_start

    expert, sloppy = _colour_demos()
    config = StagedWarmStartConfig(
        expert_steps=300, probe_every=25, polish_steps=10, habit_steps=200, habit_min_steps=10, batch_size=6,
        lr=3e-3, habit_lr=3e-3, progress=False,
    )  # fmt: skip
    done = staged_warm_start(
        tiny_model_path,
        tmp_path / "ws",
        expert=expert,
        sloppy=sloppy,
        probes={"tool_call": expert[:3]},
        habit_prompts=expert,
        config=config,
    )
    skills = done.skills
    assert skills["formed/tool_call"] >= config.skill_target and done.expert_steps < config.expert_steps
    assert skills["polished/p_tool_call"] > 0.5 and skills["base/p_tool_call"] <= config.habit_target
    assert done.habit_steps < config.habit_steps
    assert AutoModelForCausalLM.from_pretrained(done.model_dir) is not None
    assert (done.model_dir / "warm_start.json").is_file()


def test_the_staged_warm_start_refuses_what_it_cannot_use(tmp_path: Path, tiny_model_path: Path) -> None:
    from lightning_rl.trainer.staged_warm_start import StagedWarmStartConfig, staged_warm_start

    demo = ([{"role": "user", "content": "hi"}], None, "hello")
    with pytest.raises(ValueError, match="expert and sloppy"):
        staged_warm_start(tiny_model_path, tmp_path / "a", expert=[demo], sloppy=[], probes={}, habit_prompts=[])
    with pytest.raises(ValueError, match="no '<nothing-like-this>' token"):
        staged_warm_start(
            tiny_model_path,
            tmp_path / "b",
            expert=[demo],
            sloppy=[demo],
            probes={},
            habit_prompts=[],
            config=StagedWarmStartConfig(tool_token="<nothing-like-this>", progress=False),
        )


def test_a_habit_that_never_lands_inside_its_band_goes_back_to_the_nearest_check(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """``habit_floor``: the habit must stop inside [floor, target]. A band no check reaches (mean
    probability at least 0.5 with the tool call the greedy choice nowhere) ends the phase at its step
    budget, then restores the weights of the check that came closest; ``warm_start.json`` keeps every check."""
    import json

    from lightning_rl.trainer.staged_warm_start import StagedWarmStartConfig, _habit_miss, staged_warm_start

    expert, sloppy = _colour_demos()
    config = StagedWarmStartConfig(
        expert_steps=300, probe_every=25, polish_steps=10, habit_steps=12, habit_min_steps=1, habit_every=1,
        habit_floor=0.5, habit_target=0.6, habit_greedy_target=0.0, batch_size=6, lr=3e-3, habit_lr=1e-3,
        progress=False,
    )  # fmt: skip
    done = staged_warm_start(
        tiny_model_path,
        tmp_path / "ws",
        expert=expert,
        sloppy=sloppy,
        probes={"tool_call": expert[:3]},
        habit_prompts=expert,
        config=config,
    )
    curve = done.habit_curve
    assert [step for step, _, _ in curve] == list(range(1, 13))
    assert all(_habit_miss(config, p, greedy) > 0 for _, p, greedy in curve)
    best = min(curve, key=lambda c: _habit_miss(config, c[1], c[2]))  # the first of equals, as the phase keeps
    assert done.habit_steps == best[0]
    assert done.skills["base/p_tool_call"] == pytest.approx(best[1], abs=1e-5)
    record = json.loads((done.model_dir / "warm_start.json").read_text())
    assert record["skills"]["habit_steps"] == best[0] and len(record["habit_curve"]) == 12


def test_canonical_completion_writes_a_call_as_the_template_renders_it_back(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    from transformers import AutoTokenizer

    from lightning_rl.demo.calculator import CHAINED_CALCULATOR_TOOL
    from lightning_rl.engine.hf import TransformersEngine
    from lightning_rl.trainer.warm_start import canonical_completion

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = [
        {"role": "system", "content": "Use the calculator tool, then answer."},
        {"role": "user", "content": "2+3?"},
    ]
    tools = [CHAINED_CALCULATOR_TOOL]
    spaced = '<tool_call>{"name":"calculator",  "arguments":{"operation":"add"}}</tool_call>'
    text = canonical_completion(tokenizer, messages, tools, spaced)
    assert text == '<tool_call>{"name": "calculator", "arguments": {"operation": "add"}}</tool_call>'
    assert canonical_completion(tokenizer, messages, tools, "The answer is 5.") == "The answer is 5."
    # the prompt of the next turn starts with this turn's prompt + the canonical completion + end of turn
    engine = TransformersEngine.from_pretrained(tiny_model_path)
    try:
        first = engine.encode_chat(messages, tools)
        response = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.convert_tokens_to_ids("<|im_end|>")]
        call = {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": '{"operation": "add"}'}}
        history = [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}]
        second = engine.encode_chat([*history, {"role": "tool", "tool_call_id": "c", "content": "5"}], tools)
        assert second[: len(first) + len(response)] == first + response
    finally:
        engine.close()
