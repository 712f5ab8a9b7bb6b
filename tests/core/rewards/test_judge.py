"""The group judge against a scripted judge served over real HTTP (``lightning_rl.testing.FakeJudge``).

Every failure mode the judge must survive is scripted here: malformed answers, scores out of range,
the wrong number of scores, timeouts, 429 and 5xx, an endpoint without structured output, and a
refused key; plus the cache, the concurrency limit and the position-bias defences.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lightning_rl.rewards import GroupJudge, JudgeRequestError
from lightning_rl.testing.fake_judge import FakeJudge

from .conftest import by_content, judge_config

GROUP = ["answer: wrong 1", "answer: right", "answer: wrong 2", "answer: wrong 3"]


async def test_scores_follow_the_content_whatever_order_each_call_shows() -> None:
    fake = FakeJudge(by_content)
    async with fake.running() as url:
        judge = GroupJudge(judge_config(url))
        results = await judge.score_groups([GROUP] * 12)
    assert all(r == [0.1, 1.0, 0.1, 0.1] for r in results)
    assert len({tuple(shown) for shown in fake.shown}) > 1  # the order really changed between calls
    assert all(sorted(shown) == sorted(GROUP) for shown in fake.shown)
    body = fake.requests[0]
    assert body["response_format"]["type"] == "json_schema" and body["temperature"] == 0.0
    assert judge.stats.calls == 12 and judge.stats.judged_groups == 12 and judge.stats.prompt_tokens > 0


async def test_a_judge_biased_by_position_does_not_pass_its_bias_to_any_rollout() -> None:
    def first_is_best(position: int, n: int) -> float:
        return 1.0 - position / (n - 1)  # 1.0 for whatever is shown first, 0.0 for the last

    fake = FakeJudge(position_scorer=first_is_best)
    async with fake.running() as url:
        one_pass = await GroupJudge(judge_config(url, seed=3)).score_groups([GROUP] * 40)
        two_passes = await GroupJudge(judge_config(url, two_passes=True)).score_groups([GROUP] * 5)
    # one pass: the top score lands on every rollout in turn, not on the one listed first
    winners = [max(range(4), key=lambda i, r=r: r[i]) for r in one_pass if r is not None]
    assert set(winners) == {0, 1, 2, 3}
    assert max(winners.count(i) for i in range(4)) < 20
    # two passes, the second in the reverse order: a linear position preference cancels exactly
    assert all(r == pytest.approx([0.5] * 4) for r in two_passes)
    assert len(fake.requests) == 40 + 2 * 5


@pytest.mark.parametrize("fault", ["malformed", "out_of_range", "wrong_count", "empty", "429", "500", "503"])
async def test_a_bad_answer_or_a_transient_error_is_retried(fault: str) -> None:
    fake = FakeJudge(by_content, faults=[fault])
    async with fake.running() as url:
        judge = GroupJudge(judge_config(url))
        (scores,) = await judge.score_groups([GROUP])
    assert scores == [0.1, 1.0, 0.1, 0.1]
    assert judge.stats.calls == 2 and judge.stats.retries == 1
    expected = {"empty": "malformed", "429": "http_429", "500": "http_5xx", "503": "http_5xx"}.get(fault, fault)
    assert judge.stats.errors == {expected: 1}


async def test_a_timeout_is_retried() -> None:
    fake = FakeJudge(by_content, faults=["timeout"], slow_s=3.0)
    async with fake.running() as url:
        judge = GroupJudge(judge_config(url, timeout_s=0.3))
        started = time.perf_counter()
        (scores,) = await judge.score_groups([GROUP])
        elapsed = time.perf_counter() - started
    assert scores == [0.1, 1.0, 0.1, 0.1]
    assert judge.stats.errors == {"timeout": 1}
    assert elapsed < 2.5  # the slow answer was not waited for


async def test_a_group_that_fails_for_good_is_none_never_zero() -> None:
    fake = FakeJudge(by_content, faults=["malformed", "500", "out_of_range"])
    async with fake.running() as url:
        judge = GroupJudge(judge_config(url, max_retries=2))
        (failed,) = await judge.score_groups([GROUP])  # three tries, three faults
        (fine,) = await judge.score_groups([GROUP])
    assert failed is None
    assert fine == [0.1, 1.0, 0.1, 0.1]
    assert judge.stats.failed_groups == 1 and judge.stats.judged_groups == 1
    assert judge.stats.errors == {"malformed": 1, "http_5xx": 1, "out_of_range": 1}


async def test_an_endpoint_without_structured_output_gets_plain_json_from_then_on() -> None:
    fake = FakeJudge(by_content, supports_json_schema=False, fenced=True)
    async with fake.running() as url:
        judge = GroupJudge(judge_config(url, concurrency=1))
        results = await judge.score_groups([GROUP, GROUP, GROUP])
        strict = GroupJudge(judge_config(url, structured_output="json_schema"))
        (refused,) = await strict.score_groups([GROUP])
    assert results == [[0.1, 1.0, 0.1, 0.1]] * 3
    assert "response_format" in fake.requests[0]
    assert all("response_format" not in body for body in fake.requests[1:4])  # asked once, then plain
    assert judge.stats.errors == {"structured_output_rejected": 1}
    assert refused is None and strict.stats.errors == {"http_4xx": 1}  # "json_schema" means no fallback


@pytest.mark.parametrize(("fault", "model"), [("401", "fake-judge"), ("ok", "no-such-model")])
async def test_a_refused_key_or_unknown_model_stops_with_what_to_check(fault: str, model: str) -> None:
    fake = FakeJudge(by_content, faults=[fault])
    async with fake.running() as url:
        judge = GroupJudge(judge_config(url, model=model, api_key="sk-test"))
        with pytest.raises(JudgeRequestError, match="judge.model") as info:
            await judge.score_groups([GROUP])
    assert isinstance(info.value, RuntimeError)
    assert fake.headers[0]["authorization"] == "Bearer sk-test"


async def test_the_api_key_comes_from_the_named_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-from-env")
    fake = FakeJudge(by_content)
    async with fake.running() as url:
        await GroupJudge(judge_config(url, api_key_env="MY_JUDGE_KEY")).score_groups([GROUP])
    assert fake.headers[0]["authorization"] == "Bearer sk-from-env"


async def test_the_cache_answers_the_same_group_rubric_and_model_without_a_call(tmp_path: Path) -> None:
    fake = FakeJudge(by_content)
    async with fake.running() as url:
        first = GroupJudge(judge_config(url, cache=True), cache_dir=tmp_path)
        (scores,) = await first.score_groups([GROUP])
        again = GroupJudge(judge_config(url, cache=True), cache_dir=tmp_path)  # a new run, same folder
        (cached,) = await again.score_groups([GROUP])
        other_rubric = GroupJudge(judge_config(url, cache=True, rubric="Prefer brevity."), cache_dir=tmp_path)
        await other_rubric.score_groups([GROUP])
        other_group = GroupJudge(judge_config(url, cache=True), cache_dir=tmp_path)
        await other_group.score_groups([[*GROUP[:3], "answer: right again"]])
    assert cached == scores
    assert (first.stats.cache_misses, first.stats.calls) == (1, 1)
    assert (again.stats.cache_hits, again.stats.calls) == (1, 0)
    assert (other_rubric.stats.cache_misses, other_rubric.stats.calls) == (1, 1)
    assert (other_group.stats.cache_misses, other_group.stats.calls) == (1, 1)
    assert len(fake.requests) == 3
    assert len(list(tmp_path.rglob("*.json"))) == 3


async def test_a_failed_group_is_not_cached(tmp_path: Path) -> None:
    fake = FakeJudge(by_content, faults=["malformed"])
    async with fake.running() as url:
        once = GroupJudge(judge_config(url, cache=True, max_retries=0), cache_dir=tmp_path)
        (failed,) = await once.score_groups([GROUP])
        retry = GroupJudge(judge_config(url, cache=True), cache_dir=tmp_path)
        (scores,) = await retry.score_groups([GROUP])
    assert failed is None and scores == [0.1, 1.0, 0.1, 0.1]
    assert retry.stats.cache_misses == 1 and retry.stats.calls == 1


async def test_requests_in_flight_never_exceed_the_concurrency_limit() -> None:
    fake = FakeJudge(by_content, delay_s=0.05)
    async with fake.running() as url:
        judge = GroupJudge(judge_config(url, concurrency=2))
        results = await judge.score_groups([GROUP] * 8)
    assert all(r is not None for r in results)
    assert fake.max_in_flight == 2
