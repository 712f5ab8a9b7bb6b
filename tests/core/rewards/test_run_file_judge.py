"""The judge from a run file: ``[algorithm.judge]`` becomes ``TrainerConfig.judge``, checked before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from lightning_rl.rewards import DEFAULT_RUBRIC, JudgeConfig  # noqa: E402
from lightning_rl.trainer.run_file import ConfigError, load_run_file, masked  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "calculator" / "grpo_judge.toml"


def test_the_example_names_a_hosted_judge_with_its_rubric() -> None:
    plan = load_run_file(EXAMPLE)
    judge = plan.config.judge
    assert isinstance(judge, JudgeConfig)
    assert (judge.base_url, judge.model) == ("https://api.openai.com/v1", "gpt-4o-mini")
    assert judge.api_key_env == "OPENAI_API_KEY" and judge.api_key is None
    assert judge.weight == 1.0 and "correct answer" in judge.resolved_rubric


def test_overrides_reach_the_judge_and_null_turns_it_off() -> None:
    plan = load_run_file(EXAMPLE, ["algorithm.judge.base_url=http://127.0.0.1:9/v1", "algorithm.judge.rubric=null"])
    assert plan.config.judge.base_url == "http://127.0.0.1:9/v1"
    assert plan.config.judge.resolved_rubric == DEFAULT_RUBRIC
    assert load_run_file(EXAMPLE, ["algorithm.judge=null"]).config.judge is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.judge.modle=x", "algorithm.judge.modle: unknown key; did you mean 'model'?"),
        ("algorithm.judge.weight=2", "weight must be in [0, 1]"),
        ("algorithm.judge.structured_output=yes", "must be one of 'auto', 'json_schema', 'off'"),
        ("algorithm.judge.scoring=pairs", "algorithm.judge.scoring: must be one of 'group', 'logprobs'"),
        ("algorithm.judge.concurrency=many", "algorithm.judge.concurrency: expected an integer"),
    ],
)
def test_a_bad_judge_setting_names_its_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_run_file(EXAMPLE, [override])
    assert message in str(info.value)


def test_the_logprobs_mode_from_a_run_files_judge_table(tmp_path: Path) -> None:
    # the example with ``scoring = "logprobs"`` written in its [algorithm.judge] table
    (tmp_path / "demo_calculator.py").write_text((EXAMPLE.parent / "demo_calculator.py").read_text())
    text = EXAMPLE.read_text().replace('scoring = "group"', 'scoring = "logprobs"')
    assert 'scoring = "logprobs"' in text
    (tmp_path / "judge.toml").write_text(text)
    judge = load_run_file(tmp_path / "judge.toml").config.judge
    assert isinstance(judge, JudgeConfig) and judge.scoring == "logprobs"
    assert load_run_file(EXAMPLE).config.judge.scoring == "group"  # the default
    assert load_run_file(EXAMPLE, ["algorithm.judge.scoring=logprobs"]).config.judge.scoring == "logprobs"
    with pytest.raises(ConfigError, match="two_passes applies to scoring='group' only"):
        load_run_file(EXAMPLE, ["algorithm.judge.scoring=logprobs", "algorithm.judge.two_passes=true"])


def test_a_key_written_in_the_file_is_never_copied_out() -> None:
    plan = load_run_file(EXAMPLE, ["algorithm.judge.api_key=sk-secret"])
    assert plan.config.judge.resolved_api_key() == "sk-secret"
    assert masked(plan.raw)["algorithm"]["judge"]["api_key"] == "***"
