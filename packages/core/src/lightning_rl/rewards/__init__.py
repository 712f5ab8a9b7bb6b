"""Rewards without a gold answer: a group-relative LLM judge (docs/rewards.md).

Turn it on with ``TrainerConfig(judge=JudgeConfig(model=..., base_url=...))`` or an
``[algorithm.judge]`` table in a run file. After each step's rollouts, the trainer renders every
rollout of a group from its spans and an OpenAI-compatible judge scores the group's trajectories
against each other, from 0 to 1, against a rubric; the scores become the rewards (alone, or mixed
with the agent's own by ``JudgeConfig.weight``). GRPO needs only the order within a group, which
is what a judge comparing side by side gives most reliably. A small local judge that cannot write
that JSON is asked instead about one trajectory at a time for one digit, read from its logprobs
(``JudgeConfig.scoring = "logprobs"``, ``lightning_rl.rewards.digits``).
"""

from __future__ import annotations

from lightning_rl.rewards.cache import JudgeCache, cache_key
from lightning_rl.rewards.config import DEFAULT_RUBRIC, SCORING_MODES, JudgeConfig, Scoring, StructuredOutput
from lightning_rl.rewards.digits import (
    DIGIT_SYSTEM_PROMPT,
    TOP_LOGPROBS,
    digit_messages,
    digit_score,
    score_from_text,
    score_from_top_logprobs,
)
from lightning_rl.rewards.groups import JudgedSamples, combine, judge_samples, render_groups
from lightning_rl.rewards.judge import GroupJudge, JudgeRequestError, JudgeStats
from lightning_rl.rewards.prompt import SCORES_SCHEMA, SYSTEM_PROMPT, JudgeAnswerError, judge_messages, parse_scores

__all__ = [
    # configuration
    "JudgeConfig",
    "DEFAULT_RUBRIC",
    "StructuredOutput",
    "Scoring",
    "SCORING_MODES",
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
    # the logprobs mode's prompt and answer
    "digit_messages",
    "digit_score",
    "score_from_top_logprobs",
    "score_from_text",
    "DIGIT_SYSTEM_PROMPT",
    "TOP_LOGPROBS",
    # cache
    "JudgeCache",
    "cache_key",
]
