"""Which rollouts and calls an export takes from a store, read a page at a time.

An export must run in constant memory on a store of any size, so nothing here lists the store:
rollouts are read in pages of ``Selection.page_size`` (enqueue order), and each kept rollout's
spans are read, adapted into transitions and handed on before the next page is read. Two filters
need a rollout's siblings: ``top_k`` (the best attempts of a task) and preference pairs (a higher
reward against a lower one of the same task). They read the rollout's task group with
``query_rollouts(group_id=...)`` when its first member is met, and remember only the group's id, so
memory grows with the number of group ids (a few bytes each), never with rollouts or spans.

The rules are the trainers' own: only succeeded rollouts with a reward are exported (a failed one is
not a reward-0 example), a group is one task's rollouts of one step (what ``select_attempts`` and
``build_pairs`` compare), and which calls count is decided by the adapter.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

from lightning_rl.adapter import adapt_attempt, final_reward
from lightning_rl.credit import RolloutSample
from lightning_rl.roles import RoleSelector
from lightning_rl.store.base import MAX_PAGE, LightningStore
from lightning_rl.types import Rollout, RolloutStatus, Span, Transition

__all__ = ["Selection", "ExportSample", "iter_samples", "iter_groups"]

_SPAN_PAGE = 10_000


@dataclass(frozen=True)
class Selection:
    """What to export: every filter is optional and they all apply together."""

    min_reward: float | None = None
    """Keep rollouts whose final reward is at least this."""
    mode: str | None = None
    """``train``, ``val`` or ``test`` rollouts only (None: all)."""
    roles: tuple[str, ...] = ()
    """Keep only the calls of these agent roles (empty: every role)."""
    trainable_only: bool = False
    """Keep only the calls of trainable roles, as the plugins declared them (what the trainer trains)."""
    model_version: int | None = None
    """Keep only the calls served by this model version."""
    since: float | None = None
    """Rollouts that ended at or after this Unix time."""
    until: float | None = None
    """Rollouts that ended before this Unix time."""
    top_k: int | None = None
    """Keep at most this many rollouts per task group, the best first (after ``min_reward``)."""
    page_size: int = 500
    """Rollouts read per store query: memory is bounded by one page plus one rollout's spans."""

    def __post_init__(self) -> None:
        if self.min_reward is not None and not math.isfinite(self.min_reward):
            raise ValueError(f"min_reward must be a finite number, got {self.min_reward!r}.")
        if self.mode not in (None, "train", "val", "test"):
            raise ValueError(f"mode must be train, val or test, got {self.mode!r}.")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 (the best k rollouts of each task), got {self.top_k}.")
        if not 0 < self.page_size <= MAX_PAGE:
            raise ValueError(f"page_size must be between 1 and {MAX_PAGE}, got {self.page_size}.")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(f"the time range is empty: since ({self.since}) is not before until ({self.until}).")

    def role_selector(self) -> RoleSelector | None:
        """What the adapter keeps: the plugins' declarations (trainable only) or every call."""
        return None if self.trainable_only else RoleSelector.of("all")

    def keeps_rollout(self, rollout: Rollout) -> bool:
        """The filters that need only the rollout row (no spans)."""
        if rollout.status is not RolloutStatus.SUCCEEDED:
            return False
        if self.mode is not None and rollout.mode != self.mode:
            return False
        ended = rollout.ended_at if rollout.ended_at is not None else rollout.updated_at
        if self.since is not None and ended < self.since:
            return False
        return not (self.until is not None and ended >= self.until)

    def keeps_call(self, transition: Transition) -> bool:
        if self.roles and transition.role not in self.roles:
            return False
        return self.model_version is None or transition.model_version == self.model_version


@dataclass
class ExportSample:
    """One kept rollout: its row, its final reward and its kept calls in call order."""

    rollout: Rollout
    reward: float
    transitions: list[Transition]

    def as_rollout_sample(self) -> RolloutSample:
        """The trainers' view (``select_attempts``, ``build_pairs``)."""
        r = self.rollout
        return RolloutSample(r.id, r.group_id or r.id, self.reward, self.transitions)


async def _spans(store: LightningStore, attempt_id: str) -> list[Span]:
    out: list[Span] = []
    while True:
        page = await store.query_spans(attempt_id=attempt_id, limit=_SPAN_PAGE, offset=len(out))
        out += page
        if len(page) < _SPAN_PAGE:
            return out


async def load_sample(store: LightningStore, rollout: Rollout, selection: Selection) -> ExportSample | None:
    """The rollout's reward and kept calls, or None when it has no reward or the reward is too low."""
    attempts = await store.query_attempts(rollout.id)
    if not attempts:
        return None
    attempt = attempts[-1]
    spans = await _spans(store, attempt.id)
    reward = final_reward(rollout, spans)
    if reward is None or (selection.min_reward is not None and reward < selection.min_reward):
        return None
    adapted = adapt_attempt(rollout, attempt.id, spans, trainable=selection.role_selector())
    calls = [t for t in adapted.transitions if selection.keeps_call(t)]
    return ExportSample(rollout, reward, calls)


async def _rollouts(store: LightningStore, selection: Selection) -> AsyncIterator[Rollout]:
    offset = 0
    while True:
        page = await store.query_rollouts(
            status=[RolloutStatus.SUCCEEDED], mode=selection.mode, limit=selection.page_size, offset=offset
        )
        for rollout in page:
            yield rollout
        if len(page) < selection.page_size:
            return
        offset += len(page)


async def iter_groups(store: LightningStore, selection: Selection) -> AsyncIterator[list[ExportSample]]:
    """Each task group's kept rollouts (reward >= ``min_reward``, best ``top_k``), one group at a time.

    A rollout without a group is a group of its own. Groups come in the order of their first rollout.
    """
    seen: set[str] = set()
    async for rollout in _rollouts(store, selection):
        if not selection.keeps_rollout(rollout):
            continue
        if rollout.group_id is None:
            members = [rollout]
        elif rollout.group_id in seen:
            continue
        else:
            seen.add(rollout.group_id)
            members = await _group(store, rollout.group_id, selection)
        samples = [s for s in [await load_sample(store, r, selection) for r in members] if s is not None]
        ranked = sorted(samples, key=lambda s: -s.reward)  # stable: ties keep enqueue order
        kept = ranked if selection.top_k is None else ranked[: selection.top_k]
        if kept:
            yield kept


async def _group(store: LightningStore, group_id: str, selection: Selection) -> list[Rollout]:
    out: list[Rollout] = []
    while True:
        page = await store.query_rollouts(
            group_id=group_id, status=[RolloutStatus.SUCCEEDED], limit=MAX_PAGE, offset=len(out)
        )
        out += page
        if len(page) < MAX_PAGE:
            return [r for r in out if selection.keeps_rollout(r)]


async def iter_samples(store: LightningStore, selection: Selection) -> AsyncIterator[ExportSample]:
    """Every kept rollout, in enqueue order (grouped by task first when ``top_k`` is set)."""
    if selection.top_k is not None:
        async for group in iter_groups(store, selection):
            for sample in group:
                yield sample
        return
    async for rollout in _rollouts(store, selection):
        if selection.keeps_rollout(rollout):
            sample = await load_sample(store, rollout, selection)
            if sample is not None:
                yield sample
