"""Judge rewards in the trainer's shape: scored rollout samples in, re-scored rollout samples out.

The loop already turns a step's finished rollouts into ``RolloutSample``s (one reward per rollout,
grouped by task); GRPO then needs only each group's rewards. ``judge_samples`` sits between the
two: it renders every rollout of a group from its spans with APO's renderer (the same transcript a
person reads on the dashboard; the agent's own reward is not shown), has the judge score the group,
and gives each sample the reward ``weight * score + (1 - weight) * own reward``. A group the judge
could not score is dropped from the update and counted (``train/judge_excluded_rollouts``), never
scored 0: a 0 would push its rollouts' probabilities down for a failure that was the judge's.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from lightning_rl.algorithms.apo_render import render_rollout
from lightning_rl.credit import RolloutSample
from lightning_rl.rewards.judge import GroupJudge
from lightning_rl.store.base import LightningStore
from lightning_rl.types import Rollout

__all__ = ["JudgedSamples", "judge_samples", "combine"]


@dataclass
class JudgedSamples:
    """The samples whose group was judged, with their new rewards, and the step's judge metrics."""

    samples: list[RolloutSample]
    metrics: dict[str, float]


def combine(score: float, own: float, weight: float) -> float:
    """The reward GRPO sees: ``weight * score + (1 - weight) * own`` (``own`` unused at weight 1)."""
    return score if weight == 1.0 else weight * score + (1.0 - weight) * own


async def render_groups(
    store: LightningStore, rollouts: Sequence[Rollout], samples: Sequence[RolloutSample], text_limit: int
) -> list[tuple[list[RolloutSample], list[str]]]:
    """The samples grouped by group id (first-seen order), each with its rendered trajectory."""
    by_id = {r.id: r for r in rollouts}
    groups: dict[str, tuple[list[RolloutSample], list[str]]] = {}
    for sample in samples:
        rollout = by_id.get(sample.rollout_id)
        if rollout is None:
            raise ValueError(f"sample {sample.rollout_id} has no rollout among those given; pass the step's rollouts.")
        attempts = await store.query_attempts(rollout.id)
        spans = await store.query_spans(attempt_id=attempts[-1].id) if attempts else []
        members, texts = groups.setdefault(sample.group_id, ([], []))
        members.append(sample)
        texts.append(render_rollout(rollout, spans, text_limit=text_limit))
    return list(groups.values())


async def judge_samples(
    judge: GroupJudge,
    store: LightningStore,
    rollouts: Sequence[Rollout],
    samples: Sequence[RolloutSample],
    *,
    prefix: str = "train",
) -> JudgedSamples:
    """Re-score ``samples`` group by group with ``judge`` (see the module docstring).

    Args:
        judge: The judge (its stats keep summing across calls; the metrics are this call's share).
        store: Where the rollouts' spans are.
        rollouts: The finished rollouts the samples came from.
        samples: The scored samples (``reward`` is the agent's own; NaN when it emitted none).
        prefix: The metrics' prefix.

    Raises:
        ValueError: ``weight`` < 1 and a sample has no reward of its own.
        JudgeRequestError: the judge's endpoint refused the run's key, URL or model.
    """
    cfg = judge.config
    if cfg.weight < 1.0 and any(math.isnan(s.reward) for s in samples):
        raise ValueError(
            "judge.weight < 1 mixes in the agent's own reward, but a rollout emitted none; "
            "return or emit_reward() one, or set judge.weight = 1.0."
        )
    started = time.perf_counter()
    before = judge.stats.copy()
    groups = await render_groups(store, rollouts, samples, cfg.text_limit)
    results = await judge.score_groups([texts for _, texts in groups])
    kept: list[RolloutSample] = []
    scores: list[float] = []
    excluded = 0
    for (members, _), group_scores in zip(groups, results, strict=True):
        if group_scores is None:
            excluded += len(members)
            continue
        for sample, score in zip(members, group_scores, strict=True):
            kept.append(replace(sample, reward=combine(score, sample.reward, cfg.weight)))
            scores.append(score)
    metrics = judge.stats.since(before).metrics(prefix)
    metrics[f"{prefix}/judge_excluded_rollouts"] = float(excluded)
    metrics[f"{prefix}/judge_score_mean"] = statistics.fmean(scores) if scores else math.nan
    metrics[f"{prefix}/judge_s"] = time.perf_counter() - started
    return JudgedSamples(kept, metrics)
