"""Judge rewards in the trainer's shape: rollouts in a real store, rendered, judged and re-scored."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from lightning_rl import semconv
from lightning_rl.credit import RolloutSample
from lightning_rl.rewards import GroupJudge, JudgeConfig, judge_samples
from lightning_rl.store import MemoryStore
from lightning_rl.testing.fake_judge import FakeJudge
from lightning_rl.trainer.loop import collect_samples
from lightning_rl.types import AttemptStatus, Rollout, RolloutRequest, Span, Task

# group -> (rollout id, the agent's final answer, the agent's own reward or None)
GROUPS: dict[str, list[tuple[str, str, float | None]]] = {
    "g1": [("a1", "The answer is 42.", 1.0), ("a2", "The answer is 41.", 0.0), ("a3", "The answer is 42.", None)],
    "g2": [("b1", "The answer is 40.", 0.0), ("b2", "The answer is 42.", 1.0)],
}


def _gold(text: str) -> float:
    """The scripted judge knows the gold answer: 42."""
    return 1.0 if "assistant: The answer is 42." in text else 0.0


async def _scored_rollouts() -> tuple[MemoryStore, list[Rollout]]:
    store = MemoryStore()
    answers = {rid: (answer, reward) for group in GROUPS.values() for rid, answer, reward in group}
    requests = [
        RolloutRequest(id=rid, task=Task(input={"question": "What is 6 times 7?"}), group_id=group)
        for group, members in GROUPS.items()
        for rid, _, _ in members
    ]
    await store.enqueue(requests)
    for _ in requests:
        (claim,) = await store.claim("w")
        answer, reward = answers[claim.rollout.id]
        attrs: dict[str, Any] = {
            semconv.GEN_AI_INPUT_MESSAGES: json.dumps([{"role": "user", "content": "What is 6 times 7?"}]),
            semconv.RESPONSE_TEXT: answer,
            semconv.PROMPT_TOKEN_IDS: [1, 2, 3],
            semconv.RESPONSE_TOKEN_IDS: [4, 5],
        }
        span = Span(
            name=semconv.SPAN_LLM_CALL,
            rollout_id=claim.rollout.id,
            attempt_id=claim.attempt.id,
            start_ns=10,
            end_ns=20,
            attributes=attrs,
        )
        await store.add_spans([span])
        await store.finish_attempt(claim.attempt.id, AttemptStatus.SUCCEEDED, reward=reward)
    return store, [await store.get_rollout(r.id) for r in requests]


def _config(url: str, **overrides: Any) -> JudgeConfig:
    settings: dict[str, Any] = {"model": "fake-judge", "base_url": url, "backoff_s": 0.001, "cache": False}
    return JudgeConfig(**{**settings, **overrides})


async def test_each_group_is_judged_from_its_spans_and_the_scores_become_the_rewards() -> None:
    store, rollouts = await _scored_rollouts()
    collected = await collect_samples(store, rollouts, trainable=None, air={}, missing_reward=math.nan)
    assert len(collected.samples) == 5  # the rollout without a reward of its own is kept for the judge
    fake = FakeJudge(_gold)
    async with fake.running() as url:
        judged = await judge_samples(GroupJudge(_config(url)), store, rollouts, collected.samples)
    rewards = {s.rollout_id: s.reward for s in judged.samples}
    assert rewards == {"a1": 1.0, "a2": 0.0, "a3": 1.0, "b1": 0.0, "b2": 1.0}
    # one call per group, showing that group's rollouts only, and never the agent's own reward
    assert sorted(len(shown) for shown in fake.shown) == [2, 3]
    assert all(text.startswith('task: {"question": "What is 6 times 7?"}') for s in fake.shown for text in s)
    assert not any("reward" in text for s in fake.shown for text in s)
    assert judged.metrics["train/judge_calls"] == 2 and judged.metrics["train/judge_groups"] == 2
    assert judged.metrics["train/judge_excluded_rollouts"] == 0
    assert judged.metrics["train/judge_score_mean"] == pytest.approx(3 / 5)


async def test_a_weight_below_one_mixes_in_the_agents_reward_by_the_stated_rule() -> None:
    store, rollouts = await _scored_rollouts()
    collected = await collect_samples(store, rollouts, trainable=None, air={})  # a3 (no reward) left out
    fake = FakeJudge(lambda text: 0.5)
    async with fake.running() as url:
        judged = await judge_samples(GroupJudge(_config(url, weight=0.25)), store, rollouts, collected.samples)
    rewards = {s.rollout_id: s.reward for s in judged.samples}
    # 0.25 * judge (0.5) + 0.75 * own
    assert rewards == {"a1": 0.875, "a2": 0.125, "b1": 0.125, "b2": 0.875}


async def test_mixing_needs_the_agents_reward() -> None:
    store, rollouts = await _scored_rollouts()
    collected = await collect_samples(store, rollouts, trainable=None, air={}, missing_reward=math.nan)
    judge = GroupJudge(_config("http://127.0.0.1:9/v1", weight=0.5))
    with pytest.raises(ValueError, match="set judge.weight = 1.0"):
        await judge_samples(judge, store, rollouts, collected.samples)


async def test_a_group_the_judge_cannot_score_is_left_out_and_counted() -> None:
    store, rollouts = await _scored_rollouts()
    collected = await collect_samples(store, rollouts, trainable=None, air={}, missing_reward=math.nan)
    g1_only = [s for s in collected.samples if s.group_id == "g1"]
    g2_only = [s for s in collected.samples if s.group_id == "g2"]
    fake = FakeJudge(_gold, faults=["malformed", "500"])
    async with fake.running() as url:
        judge = GroupJudge(_config(url, max_retries=1))
        failed = await judge_samples(judge, store, rollouts, g1_only)
        fine = await judge_samples(judge, store, rollouts, g2_only)
    assert failed.samples == []  # not scored 0: absent
    assert failed.metrics["train/judge_excluded_rollouts"] == 3
    assert failed.metrics["train/judge_failed_groups"] == 1
    assert failed.metrics["train/judge_errors/malformed"] == 1 and failed.metrics["train/judge_errors/http_5xx"] == 1
    assert math.isnan(failed.metrics["train/judge_score_mean"])
    assert [(s.rollout_id, s.reward) for s in fine.samples] == [("b1", 0.0), ("b2", 1.0)]
    assert fine.metrics["train/judge_failed_groups"] == 0 and fine.metrics["train/judge_calls"] == 1


async def test_a_sample_from_another_step_is_a_clear_error() -> None:
    store, rollouts = await _scored_rollouts()
    stray = RolloutSample("elsewhere", "g9", 1.0, [])
    with pytest.raises(ValueError, match="pass the step's rollouts"):
        await judge_samples(GroupJudge(_config("http://127.0.0.1:9/v1")), store, rollouts, [stray])
