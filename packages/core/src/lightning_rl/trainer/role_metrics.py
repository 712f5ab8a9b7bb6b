"""The per-role view of a step: what each role of a multi-agent agent did and what of it trained.

A multi-agent agent mixes roles that train with roles that stay frozen (a critic, a planner run by
another model). The step's totals (``train/n_transitions``, ``train/untrainable_calls``,
``train/tool_call_rate``) cannot show that the frozen role's calls stayed out of the update, or that
one role's tool errors fell while the other's did not. So each step also logs, for every role seen
in the scored rollouts, ``<prefix>/role/<role>/...``:

* ``calls``: model calls the role made;
* ``trained_transitions`` (train) / ``trainable_transitions`` (validation, which trains nothing):
  the role's transitions handed to the update rule, 0 for a frozen role (the update rule may then
  use a subset: ``train/n_updated_transitions``);
* ``air_mean``: the AIR reward per call of the role (the run's ``air`` policy; 0 without signals);
* ``tool_error_rate``: fraction of the role's calls that got at least one ``tool_error`` signal;
* ``tool_call_rate``: fraction of the role's calls whose response called a tool;
* ``weights_version``: the newest weights version that answered the role's calls (only when the
  server reports versions, as the embedded engine does). A role answered by frozen weights
  (``TrainerConfig.untrainable_roles="frozen"``) stays at the starting version while the trained
  roles' version rises with each update.
* ``adapter_version``: with per-role adapters (``TrainerConfig.adapters="per_role"``), the newest
  version of the role's own LoRA adapter that answered its calls (absent for a role the base
  weights answered: a frozen role, or a trainable role before its first update).

Everything comes from the spans ``collect_samples`` has already read: no extra store query. Roles,
AIR and which call a signal belongs to are the adapter's own (``adapt_attempt`` on the same spans),
so the view shows exactly what training saw. The adapter keeps only trainable calls, so an attempt
with frozen calls is adapted once more with every role kept, and an attempt with a ``tool_error``
signal once more with a policy that counts those signals; an attempt with neither costs nothing.

``role_table`` reads the view back from a run's history (``TrainResult.history`` or the rows of
``metrics.jsonl``) as first vs last value per role, for reports and benchmarks.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lightning_rl.adapter import AdaptedAttempt, AIRPolicy, Signal, adapt_attempt
from lightning_rl.types import Rollout, Span, Transition

__all__ = ["UNASSIGNED_ROLE", "RoleCall", "role_key", "role_calls", "role_metrics", "role_table"]

log = logging.getLogger(__name__)

UNASSIGNED_ROLE = "unassigned"
"""The key of the calls that carry no role (a single-agent agent's calls, or a framework that named none)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def _count_signal(_signal: Signal) -> float:
    return 1.0


_COUNT_TOOL_ERRORS: AIRPolicy = {"tool_error": _count_signal}
"""An AIR "policy" whose reward on a call is the number of ``tool_error`` signals attached to it
(``tool_error:<tool>`` keys are absent, so every tool falls back to this one)."""


@dataclass(frozen=True)
class RoleCall:
    """One model call of a scored rollout, as the per-role view counts it."""

    role: str | None
    trained: bool
    """The call became a transition handed to the update rule (its role is trainable)."""
    air: float = 0.0
    """AIR reward the adapter attached to the call."""
    tool_error: bool = False
    """At least one ``tool_error`` signal was attached to the call."""
    tool_call: bool = False
    """The response called a tool."""
    weights_version: int | None = None
    """The weights version that answered the call (``None``: the server did not say)."""
    adapter_version: int | None = None
    """The version of the role's LoRA adapter that answered the call (``None``: the base weights)."""


def role_key(role: str | None) -> str:
    """``role`` as it appears in a metric key: ``train/role/<role_key(role)>/calls``.

    A ``/`` would split the key (``train/role/team/writer/calls``: which part is the role?), and
    MLflow rejects any name with characters other than letters, digits, ``_ - . /`` or space, or one
    that is not a normalised path. So every character outside ``[A-Za-z0-9_.-]`` becomes ``_``
    (``team/writer`` -> ``team_writer``), a name of only dots becomes underscores, and no role
    (None or empty) is ``unassigned``. Two roles that differ only in such characters share a key:
    ``role_metrics`` pools them and warns.
    """
    if not role:
        return UNASSIGNED_ROLE
    key = _UNSAFE.sub("_", role)
    return "_" * len(key) if not key.strip(".") else key


def _has_tool_call(transition: Transition) -> bool:
    text = transition.text
    return bool(transition.tool_call_ids) or (text is not None and bool(text.tool_calls))


def role_calls(
    rollout: Rollout,
    attempt_id: str,
    spans: Sequence[Span],
    adapted: AdaptedAttempt,
    *,
    air: AIRPolicy | None,
) -> list[RoleCall]:
    """Every model call of the attempt, for ``role_metrics``.

    ``adapted`` is what ``adapt_attempt(rollout, attempt_id, spans, air=air, trainable=...)``
    returned for training: its transitions are the trained calls. The frozen calls and the
    ``tool_error`` attachments are recomputed with the adapter only when there are any (see the
    module docstring).
    """
    every = adapted.transitions
    if adapted.n_untrainable:
        every = adapt_attempt(rollout, attempt_id, spans, trainable="all", air=air).transitions
    trained = {t.span_id for t in adapted.transitions}
    errors = [0.0] * len(every)
    if any(s.name == "tool_error" for s in adapted.signals):
        counted = adapt_attempt(rollout, attempt_id, spans, trainable="all", air=_COUNT_TOOL_ERRORS)
        errors = [t.reward for t in counted.transitions]
    return [
        RoleCall(
            role=t.role,
            trained=t.span_id in trained,
            air=t.reward,
            tool_error=n > 0,
            tool_call=_has_tool_call(t),
            weights_version=t.model_version,
            adapter_version=t.adapter_version,
        )
        for t, n in zip(every, errors, strict=True)
    ]


def role_metrics(
    prefix: str, calls: Iterable[RoleCall], *, trained_name: str = "trained_transitions"
) -> dict[str, float]:
    """``{prefix}/role/<role_key>/{calls, <trained_name>, air_mean, tool_error_rate, tool_call_rate}``,
    and ``weights_version`` when the server reported versions.

    One entry per role that made at least one call (so every rate has a denominator); a role that
    made none this step has no keys in the row. Validation passes ``trained_name="trainable_transitions"``.
    """
    pooled: dict[str, list[RoleCall]] = {}
    names: dict[str, set[str | None]] = {}
    for call in calls:
        key = role_key(call.role)
        pooled.setdefault(key, []).append(call)
        names.setdefault(key, set()).add(call.role or None)
    out: dict[str, float] = {}
    for key in sorted(pooled):
        if len(names[key]) > 1:
            log.warning(
                "roles %s share the metric key %r (characters outside [A-Za-z0-9_.-] become '_'); their "
                "%s/role metrics are pooled: rename one of them to tell them apart",
                sorted(str(n) for n in names[key]),
                key,
                prefix,
            )
        group = pooled[key]
        n = len(group)
        base = f"{prefix}/role/{key}"
        out[f"{base}/calls"] = float(n)
        out[f"{base}/{trained_name}"] = float(sum(c.trained for c in group))
        out[f"{base}/air_mean"] = sum(c.air for c in group) / n
        out[f"{base}/tool_error_rate"] = sum(c.tool_error for c in group) / n
        out[f"{base}/tool_call_rate"] = sum(c.tool_call for c in group) / n
        versions = [c.weights_version for c in group if c.weights_version is not None]
        if versions:
            out[f"{base}/weights_version"] = float(max(versions))
        adapters = [c.adapter_version for c in group if c.adapter_version is not None]
        if adapters:
            out[f"{base}/adapter_version"] = float(max(adapters))
    return out


def role_table(
    history: Iterable[Mapping[str, float]], prefix: str = "train"
) -> dict[str, dict[str, tuple[float, float]]]:
    """Per role, per metric: the value in the first and in the last row that logged it.

    ``history`` is ``TrainResult.history`` or the rows of ``metrics.jsonl``; ``prefix`` is ``train``
    or ``val``. Roles are keyed as in the metric names (``role_key``), in sorted order; a role that
    appeared in one row only has first == last.
    """
    marker = f"{prefix}/role/"
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for row in history:
        for name, value in row.items():
            if not name.startswith(marker):
                continue
            role, _, metric = name[len(marker) :].rpartition("/")
            if not role:
                continue
            metrics = table.setdefault(role, {})
            first = metrics[metric][0] if metric in metrics else float(value)
            metrics[metric] = (first, float(value))
    return {role: table[role] for role in sorted(table)}
