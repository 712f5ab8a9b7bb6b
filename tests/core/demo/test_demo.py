"""The demo's task, tool and reward functions, and a smoke run of the whole demo pipeline (small settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_rl.demo.calculator import calculator, demonstrations, make_tasks, score_answer
from lightning_rl.engine.toolcalls import parse_tool_calls


def test_calculator_applies_the_chosen_operation_and_rejects_others() -> None:
    assert calculator("add", 7, 5) == "12"
    assert calculator("subtract", 7, 9) == "-2"
    assert calculator("multiply", 7, 5) == "35"
    with pytest.raises(ValueError, match="unknown operation"):
        calculator("divide", 7, 5)


def test_score_answer_reads_the_last_integer() -> None:
    assert score_answer("The answer is 42.", 42) == 1.0
    assert score_answer("I think it is -3.", -3) == 1.0
    assert score_answer("7 times 6 is 41", 42) == 0.0
    assert score_answer(None, 1) == 0.0


def test_tasks_are_distinct_deterministic_and_bounded() -> None:
    a, b = make_tasks(50, seed=3), make_tasks(50, seed=3)
    assert [t.id for t in a] == [t.id for t in b] and len({t.id for t in a}) == 50
    for t in a:
        assert t.input["answer"] == int(calculator(t.input["operation"], t.input["a"], t.input["b"]))
    with pytest.raises(ValueError, match="distinct questions"):
        make_tasks(10_000, seed=0)


def test_demonstrations_parse_as_tool_calls_and_mix_as_asked() -> None:
    tasks = make_tasks(200, seed=0)
    expert = demonstrations(tasks, tool_rate=1.0, seed=0)
    assert len(expert) == 400  # a tool call and a final answer per task
    call = parse_tool_calls(expert[0].completion)
    assert call.parse_error is None and json.loads(call.tool_calls[0].arguments) == {
        "operation": tasks[0].input["operation"]
    }
    assert score_answer(expert[1].completion, tasks[0].input["answer"]) == 1.0
    sloppy = demonstrations(tasks, tool_rate=0.3, seed=0)
    from_memory = [d for d in sloppy if d.completion.startswith("I think")]
    assert 0.6 < len(from_memory) / len(tasks) < 0.8
    for i, task in enumerate(tasks[:20]):  # answers from memory are always wrong
        (guess,) = demonstrations([task], tool_rate=0.0, seed=i)
        assert guess.completion.startswith("I think") and score_answer(guess.completion, task.input["answer"]) == 0.0


def test_demo_pipeline_runs_end_to_end_with_small_settings(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from lightning_rl.demo.run import DemoConfig, run_demo

    cfg = DemoConfig(
        run_dir=str(tmp_path / "demo"),
        steps=1,
        batch_size=2,
        group_size=2,
        n_train=12,
        n_val=4,
        expert_steps=4,
        polish_steps=2,
        habit_steps=2,
        sft_batch_size=4,
        val_every=0,
        progress=False,
    )
    result = run_demo(cfg)
    assert result.val_base is not None and result.val_trained is not None
    assert (tmp_path / "demo" / "warm_start" / "config.json").exists()
    assert (tmp_path / "demo" / "metrics.jsonl").read_text().count("train/reward_mean") == 1
    skills = json.loads((tmp_path / "demo" / "warm_start" / "warm_start.json").read_text())["skills"]
    assert {"formed/report", "polished/report", "base/p_tool_call"} <= set(skills)
    assert all(0.0 <= skills[k] <= 1.0 for k in skills if not k.endswith("_steps"))


def test_reporting_demonstrations_report_the_tools_number_whatever_the_question() -> None:
    from lightning_rl.demo.calculator import reporting_demonstrations

    tasks = make_tasks(50, seed=0)
    demos = reporting_demonstrations(tasks, per_task=3, seed=0)
    assert len(demos) == 150
    results = [int(d.messages[-1]["content"]) for d in demos]
    for d, result in zip(demos, results, strict=True):
        assert d.messages[-1]["role"] == "tool" and score_answer(d.completion, result) == 1.0
    # unrelated to the question (so only copying predicts it), of many lengths, some negative
    answers = [t.input["answer"] for t in tasks for _ in range(3)]
    assert sum(r == a for r, a in zip(results, answers, strict=True)) < 5
    assert len({len(str(abs(r))) for r in results}) >= 4 and any(r < 0 for r in results)


def test_greedy_exact_match_is_what_greedy_decoding_reproduces() -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from lightning_rl.demo.run import first_token_probability, greedy_exact_match
    from lightning_rl.engine.tiny import default_tiny_model

    model = AutoModelForCausalLM.from_pretrained(default_tiny_model())
    prompt = [5, 17, 33, 8, 61]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False, pad_token_id=0)
    greedy = out[0, len(prompt) :].tolist()
    wrong = [*greedy[:-1], (greedy[-1] + 1) % 100]
    assert greedy_exact_match(model, [(prompt, greedy)], 0) == 1.0
    assert greedy_exact_match(model, [(prompt, greedy), (prompt, wrong)], 0) == 0.5
    mean_p, argmax = first_token_probability(model, [prompt], greedy[0])
    assert 0.0 < mean_p <= 1.0 and argmax == 1.0


def test_warm_start_progress_prints_periodic_lines_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    from lightning_rl.trainer.warm_start_progress import WarmStartProgress

    with WarmStartProgress(3, console=Console(force_terminal=False), every_s=0.0) as bar:
        for step in range(3):
            bar.on_step(step, 0.5 / (step + 1), 1e-3)
        bar.note_skills({"report": 0.75})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("warm-start:")
    assert "warm-start step 1/3  loss 0.5000" in lines[1] and "step 3/3" in lines[3]
    assert "report 0.75" in lines[-1]
    with WarmStartProgress(3, console=Console(force_terminal=False), enabled=False) as bar:
        bar.on_step(0, 1.0, 1e-3)
    assert capsys.readouterr().out == ""


@pytest.mark.slow  # the real SmolLM2-135M: one LoRA warm-start chunk, one GRPO step on four rollouts
@pytest.mark.usefixtures("smollm2")
def test_the_smollm2_demo_runs_end_to_end_with_small_settings(tmp_path: Path) -> None:
    """``lightning-rl demo --model smollm2-135m``'s pipeline on the real model, shrunk: LoRA warm start
    merged into a saved folder that loads, shared-prefix updates, one GRPO step, held-out before/after."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from lightning_rl.demo.run import DemoConfig, run_demo

    cfg = DemoConfig.smollm2(
        run_dir=str(tmp_path / "demo"),
        steps=1,
        batch_size=2,
        group_size=2,
        n_train=8,
        n_val=2,
        n_probe=2,
        expert_steps=2,
        probe_every=2,
        polish_steps=0,
        habit_steps=1,
        habit_min_steps=1,
        habit_every=1,
        sft_batch_size=2,
        max_tokens=24,
        progress=False,
    )
    result = run_demo(cfg)
    assert result.model == "smollm2-135m"
    assert result.val_base is not None and result.val_trained is not None
    warm = tmp_path / "demo" / "warm_start"
    config = json.loads((warm / "config.json").read_text())
    assert config["model_type"] == "llama"  # merged LoRA: a plain model folder, no adapter files
    assert not list(warm.glob("adapter_*"))
    assert (tmp_path / "demo" / "metrics.jsonl").read_text().count("train/reward_mean") == 1
