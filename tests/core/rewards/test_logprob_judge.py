"""The ``logprobs`` scoring mode: one trajectory per call, one digit read from the top logprobs.

The reading of an answer is checked on its own (weighted mean, no digit, a text digit), then the
mode end to end against the scripted judge over real HTTP: one call per distinct trajectory with
``max_tokens=1`` and ``top_logprobs=20``, a trajectory without a digit failing its group (left out
and counted, never 0), endpoints that ignore or refuse logprobs, the cache one trajectory at a time,
and the concurrency limit shared by a group's calls.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from lightning_rl.rewards import (
    DIGIT_SYSTEM_PROMPT,
    GroupJudge,
    JudgeAnswerError,
    JudgeConfig,
    digit_messages,
    digit_score,
    score_from_text,
    score_from_top_logprobs,
)
from lightning_rl.testing.fake_judge import FakeJudge, digit_distribution, trajectories_in

from .conftest import by_content, judge_config


def _logprob_config(url: str, **overrides: Any) -> JudgeConfig:
    return judge_config(url, **{"scoring": "logprobs", **overrides})


def _top(*pairs: tuple[str, float]) -> list[dict[str, Any]]:
    return [{"token": t, "logprob": math.log(p)} for t, p in pairs]


GROUP = ["answer: wrong 1", "answer: right", "answer: wrong 2", "answer: wrong 3"]


# --- reading one answer ---------------------------------------------------------------------------


def test_the_score_is_the_digits_weighted_mean_renormalised_over_the_digits() -> None:
    top = _top(("7", 0.4), ("The", 0.3), (" 7", 0.1), ("9", 0.15), ("10", 0.05))
    # "7" and " 7" are one digit; "The" and "10" are not digits: the mean is over 0.65 of the mass
    assert score_from_top_logprobs(top) == pytest.approx((7 * 0.5 + 9 * 0.15) / 0.65 / 9)
    assert score_from_top_logprobs(_top(("0", 0.9), ("x", 0.1))) == 0.0
    assert score_from_top_logprobs(_top(("9", 0.2))) == pytest.approx(1.0)
    for score in (0.0, 0.1, 0.37, 0.5, 0.99, 1.0):
        assert score_from_top_logprobs(_top(*digit_distribution(score))) == pytest.approx(score)


def test_no_digit_among_the_top_tokens_is_malformed() -> None:
    with pytest.raises(JudgeAnswerError, match="no digit among") as info:
        score_from_top_logprobs(_top(("The", 0.7), ("Good", 0.2), ("-", 0.1)))
    assert info.value.kind == "malformed"
    with pytest.raises(JudgeAnswerError):
        score_from_top_logprobs([])


def test_a_text_answer_is_read_as_one_digit() -> None:
    assert score_from_text("7") == pytest.approx(7 / 9)
    assert score_from_text(" 9\n") == 1.0
    assert score_from_text("3. It answers wrongly.") == pytest.approx(3 / 9)
    for text, kind in [("10", "out_of_range"), ("0.5", "out_of_range"), ("Good", "malformed"), ("", "malformed")]:
        with pytest.raises(JudgeAnswerError) as info:
            score_from_text(text)
        assert info.value.kind == kind


def test_a_completion_is_read_from_its_logprobs_else_from_its_text() -> None:
    def completion(content: str | None, logprobs: Any) -> dict[str, Any]:
        return {"choices": [{"message": {"role": "assistant", "content": content}, "logprobs": logprobs}]}

    top = _top(("2", 0.5), ("4", 0.5))
    with_top = {"content": [{"token": "2", "logprob": math.log(0.5), "top_logprobs": top}]}
    assert digit_score(completion("2", with_top)) == pytest.approx(3 / 9)
    only_chosen = {"content": [{"token": "6", "logprob": -0.1, "top_logprobs": []}]}
    assert digit_score(completion("6", only_chosen)) == pytest.approx(6 / 9)
    assert digit_score(completion("5", None)) == pytest.approx(5 / 9)  # logprobs ignored: the text
    with pytest.raises(JudgeAnswerError, match="no choices"):
        digit_score({"choices": []})


def test_the_prompt_shows_the_rubric_and_one_trajectory_and_asks_for_one_digit() -> None:
    messages = digit_messages("Be right.", "task: 2+2\nassistant: 4")
    assert messages[0] == {"role": "system", "content": DIGIT_SYSTEM_PROMPT}
    user = messages[1]["content"]
    assert user.startswith("Rubric:\nBe right.") and user.rstrip().endswith("Reply with one digit only.")
    assert trajectories_in({"messages": messages}) == ["task: 2+2\nassistant: 4"]


# --- the mode end to end --------------------------------------------------------------------------


async def test_one_call_per_trajectory_asks_for_one_token_with_its_top_logprobs() -> None:
    fake = FakeJudge(by_content)
    async with fake.running() as url:
        judge = GroupJudge(_logprob_config(url))
        (scores,) = await judge.score_groups([GROUP])
    assert scores == pytest.approx([0.1, 1.0, 0.1, 0.1])
    assert sorted(text for shown in fake.shown for text in shown) == sorted(GROUP)  # one trajectory a call
    body = fake.requests[0]
    assert (body["max_tokens"], body["logprobs"], body["top_logprobs"], body["temperature"]) == (1, True, 20, 0.0)
    assert "response_format" not in body
    assert judge.stats.calls == 4 and judge.stats.judged_groups == 1
    assert judge.stats.prompt_tokens > 0 and judge.stats.completion_tokens == 4


async def test_scripted_logprobs_give_their_weighted_mean_and_duplicates_are_asked_once() -> None:
    tops = {"a": [("3", 0.6), ("5", 0.2), ("I", 0.2)], "b": [("8", 0.5), ("9", 0.5)]}
    fake = FakeJudge(digit_logprobs=lambda text: tops[text[-1]])
    async with fake.running() as url:
        judge = GroupJudge(_logprob_config(url))
        (scores,) = await judge.score_groups([["answer a", "answer b", "answer a"]])
    assert scores == pytest.approx([3.5 / 9, 8.5 / 9, 3.5 / 9])
    assert judge.stats.calls == 2  # "answer a" twice in the group, asked once


async def test_a_trajectory_without_a_digit_is_retried_then_its_group_is_left_out() -> None:
    def no_digit_for_wrong_2(text: str) -> list[tuple[str, float]]:
        return [("Hmm", 1.0)] if "wrong 2" in text else digit_distribution(by_content(text))

    fake = FakeJudge(faults=["malformed"], digit_logprobs=no_digit_for_wrong_2)
    async with fake.running() as url:
        judge = GroupJudge(_logprob_config(url, max_retries=2, concurrency=1))
        failed, fine = await judge.score_groups([GROUP, [GROUP[0], GROUP[1]]])
    assert failed is None  # never a 0 for the judge's failure
    assert fine == pytest.approx([0.1, 1.0])
    assert judge.stats.failed_groups == 1 and judge.stats.judged_groups == 1
    # the scripted fault (one try of the first group) plus three tries of "wrong 2"
    assert judge.stats.errors == {"malformed": 4}
    assert judge.stats.retries == 3


async def test_an_endpoint_that_ignores_logprobs_is_read_from_its_text_digit() -> None:
    fake = FakeJudge(by_content, supports_logprobs=False)
    async with fake.running() as url:
        judge = GroupJudge(_logprob_config(url))
        (scores,) = await judge.score_groups([GROUP])
    assert scores == pytest.approx([1 / 9, 1.0, 1 / 9, 1 / 9])  # the nearest digits: 1 and 9
    assert judge.stats.errors == {}


async def test_an_endpoint_that_refuses_logprobs_is_asked_for_text_from_then_on() -> None:
    fake = FakeJudge(by_content, rejects_logprobs=True)
    async with fake.running() as url:
        judge = GroupJudge(_logprob_config(url, concurrency=1))
        results = await judge.score_groups([GROUP, GROUP])
    assert results == [pytest.approx([1 / 9, 1.0, 1 / 9, 1 / 9])] * 2
    assert fake.requests[0]["logprobs"] is True
    assert all("logprobs" not in body for body in fake.requests[1:])
    assert judge.stats.errors == {"logprobs_rejected": 1} and judge.stats.calls == 1 + 8


async def test_the_cache_keeps_each_trajectory_apart_from_the_group_mode(tmp_path: Path) -> None:
    fake = FakeJudge(by_content)
    async with fake.running() as url:
        first = GroupJudge(_logprob_config(url, cache=True), cache_dir=tmp_path)
        (scores,) = await first.score_groups([GROUP])
        again = GroupJudge(_logprob_config(url, cache=True), cache_dir=tmp_path)  # a new run, same folder
        (cached,) = await again.score_groups([GROUP])
        grown = GroupJudge(_logprob_config(url, cache=True), cache_dir=tmp_path)
        (mixed,) = await grown.score_groups([[*GROUP[:3], "answer: right again"]])
        grouped = GroupJudge(_logprob_config(url, cache=True, scoring="group"), cache_dir=tmp_path)
        await grouped.score_groups([GROUP])
    assert (first.stats.cache_misses, first.stats.cache_hits, first.stats.calls) == (4, 0, 4)
    assert cached == scores and (again.stats.cache_hits, again.stats.calls) == (4, 0)
    assert mixed == pytest.approx([0.1, 1.0, 0.1, 1.0])
    assert (grown.stats.cache_hits, grown.stats.cache_misses, grown.stats.calls) == (3, 1, 1)
    assert (grouped.stats.cache_misses, grouped.stats.calls) == (1, 1)  # the modes never share an entry


async def test_a_failed_group_is_not_cached_but_its_scored_trajectories_are(tmp_path: Path) -> None:
    broken = {"wrong 1": True}

    def top(text: str) -> list[tuple[str, float]]:
        return [("Hmm", 1.0)] if broken["wrong 1"] and "wrong 1" in text else digit_distribution(by_content(text))

    fake = FakeJudge(digit_logprobs=top)
    async with fake.running() as url:
        judge = GroupJudge(_logprob_config(url, cache=True, max_retries=1), cache_dir=tmp_path)
        (failed,) = await judge.score_groups([GROUP[:2]])
        broken["wrong 1"] = False
        again = GroupJudge(_logprob_config(url, cache=True), cache_dir=tmp_path)
        (scores,) = await again.score_groups([GROUP[:2]])
    assert failed is None and judge.stats.errors == {"malformed": 2} and judge.stats.failed_groups == 1
    assert scores == pytest.approx([0.1, 1.0])
    assert (again.stats.cache_hits, again.stats.cache_misses, again.stats.calls) == (1, 1, 1)


async def test_a_groups_calls_share_the_concurrency_limit() -> None:
    fake = FakeJudge(by_content, delay_s=0.05)
    async with fake.running() as url:
        judge = GroupJudge(_logprob_config(url, concurrency=3))
        results = await judge.score_groups([[f"answer {i}" for i in range(8)], [f"other {i}" for i in range(8)]])
    assert all(r is not None and len(r) == 8 for r in results)
    assert fake.max_in_flight == 3 and judge.stats.calls == 16


# --- configuration --------------------------------------------------------------------------------


def test_a_bad_scoring_mode_names_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="JudgeConfig.scoring must be 'group' .* or 'logprobs'") as info:
        JudgeConfig(model="m", scoring="pairs")  # pyright: ignore[reportArgumentType]
    assert "'pairs'" in str(info.value)
    with pytest.raises(ValueError, match="two_passes applies to scoring='group' only"):
        JudgeConfig(model="m", scoring="logprobs", two_passes=True)
    assert JudgeConfig(model="m").scoring == "group"
