"""Rewards without a gold answer: a group-relative LLM judge (docs/rewards.md).

Turn it on with ``TrainerConfig(judge=JudgeConfig(model=..., base_url=...))`` or an
``[algorithm.judge]`` table in a run file. After each step's rollouts, the trainer renders every
rollout of a group from its spans and an OpenAI-compatible judge scores the group's trajectories
against each other, from 0 to 1, against a rubric; the scores become the rewards (alone, or mixed
with the agent's own by ``JudgeConfig.weight``). GRPO needs only the order within a group, which
is what a judge comparing side by side gives most reliably.
"""

from __future__ import annotations

from lightning_rl.rewards.cache import JudgeCache, cache_key
from lightning_rl.rewards.config import DEFAULT_RUBRIC, JudgeConfig, StructuredOutput
from lightning_rl.rewards.groups import JudgedSamples, combine, judge_samples, render_groups
from lightning_rl.rewards.judge import GroupJudge, JudgeRequestError, JudgeStats
from lightning_rl.rewards.prompt import SCORES_SCHEMA, SYSTEM_PROMPT, JudgeAnswerError, judge_messages, parse_scores

__all__ = [
    # configuration
    "JudgeConfig",
    "DEFAULT_RUBRIC",
    "StructuredOutput",
    # judging
    "GroupJudge",
    "JudgeStats",
    "JudgeRequestError",
    # in the trainer's shape
    "judge_samples",
    "render_groups",
    "JudgedSamples",
    "combine",
    # prompt and answer
    "judge_messages",
    "parse_scores",
    "JudgeAnswerError",
    "SYSTEM_PROMPT",
    "SCORES_SCHEMA",
    # cache
    "JudgeCache",
    "cache_key",
]
