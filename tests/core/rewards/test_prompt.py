"""Reading a judge's answer: tolerant of how models write JSON, strict about what would corrupt a reward."""

from __future__ import annotations

import pytest

from lightning_rl.rewards import DEFAULT_RUBRIC, JudgeAnswerError, JudgeConfig, judge_messages, parse_scores


@pytest.mark.parametrize(
    "text",
    [
        '{"scores": [{"trajectory_id": 1, "explanation": "x", "score": 0.2}, {"trajectory_id": 2, "score": 0.9}]}',
        'Sure!\n```json\n{"scores": [{"trajectory_id": "1", "score": 0.2}, {"trajectory_id": "2", "score": 0.9}]}\n```',
        # ids out of order: mapped by id, not by position
        '{"scores": [{"trajectory_id": 2, "score": 0.9}, {"trajectory_id": 1, "score": 0.2}]}',
        '{"scores": [{"id": "trajectory 2", "score": "0.9"}, {"id": "trajectory 1", "score": 0.2}]}',
        '{"1": 0.2, "2": 0.9}',
        "[0.2, 0.9]",
        "Trajectory 1: 0.2\nTrajectory 2: 0.9",
    ],
)
def test_the_scores_are_read_from_any_common_shape(text: str) -> None:
    assert parse_scores(text, 2) == [0.2, 0.9]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("The second one is clearly better.", "malformed"),
        ('{"verdict": "good"}', "malformed"),
        ('{"scores": [{"trajectory_id": 1, "score": "high"}, {"trajectory_id": 2, "score": 0.1}]}', "malformed"),
        ('{"scores": [{"trajectory_id": 7, "score": 0.5}, {"trajectory_id": 2, "score": 0.1}]}', "malformed"),
        ('{"scores": [{"trajectory_id": 1, "score": 7}, {"trajectory_id": 2, "score": 3}]}', "out_of_range"),
        ("[-0.5, 0.5]", "out_of_range"),
        ('{"scores": [0.1, NaN]}', "out_of_range"),
        ('{"scores": [{"trajectory_id": 1, "score": 0.5}]}', "wrong_count"),
        ("[0.1, 0.2, 0.3]", "wrong_count"),
        ('{"scores": [{"trajectory_id": 1, "score": 0.5}, {"trajectory_id": 1, "score": 0.4}]}', "wrong_count"),
    ],
)
def test_an_answer_that_would_corrupt_the_reward_raises_with_its_kind(text: str, kind: str) -> None:
    with pytest.raises(JudgeAnswerError) as info:
        parse_scores(text, 2)
    assert info.value.kind == kind
    assert isinstance(info.value, ValueError)


def test_the_prompt_numbers_the_trajectories_and_carries_the_rubric() -> None:
    system, user = judge_messages("Be right.", ["first text", "second text"])
    assert system["role"] == "system" and "JSON" in system["content"]
    assert user["content"].startswith("Rubric:\nBe right.")
    assert '<trajectory id="1">\nfirst text\n</trajectory>' in user["content"]
    assert '<trajectory id="2">\nsecond text\n</trajectory>' in user["content"]


def test_the_config_rejects_bad_values_with_what_to_write() -> None:
    assert JudgeConfig(model="m").resolved_rubric == DEFAULT_RUBRIC
    with pytest.raises(ValueError, match="weight must be in"):
        JudgeConfig(model="m", weight=1.5)
    with pytest.raises(ValueError, match="http"):
        JudgeConfig(model="m", base_url="localhost:8000/v1")
    with pytest.raises(ValueError, match="rubric is blank"):
        JudgeConfig(model="m", rubric="  ")
    with pytest.raises(ValueError, match="model is empty"):
        JudgeConfig(model="")
