"""What the judge reads and how its answer is read back: pure functions, no I/O.

The judge sees every trajectory of one group in one message, numbered 1..N in the order of that
call (shuffled by the caller), and answers with one score per trajectory. Scoring them side by side
is what makes the score group-relative: GRPO only needs their order within the group, and a judge
compares far more reliably than it grades on an absolute scale.

Endpoints that support it get a JSON-schema ``response_format`` (``SCORES_SCHEMA``), so the answer
is JSON by construction. Many do not (older servers, small local models), so ``parse_scores`` is
tolerant of what models actually write: code fences, prose around the JSON, ids as strings, a bare
list of numbers, or ``Trajectory 2: 0.7`` lines. It is strict about what would corrupt the reward:
a score outside [0, 1], a missing or repeated trajectory, the wrong number of scores. Those raise
``JudgeAnswerError`` and the call is retried.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, cast

__all__ = ["JudgeAnswerError", "SCORES_SCHEMA", "SYSTEM_PROMPT", "judge_messages", "parse_scores"]


class JudgeAnswerError(ValueError):
    """The judge's answer could not be read as one score in [0, 1] per trajectory (the call is retried).

    ``kind`` names the failure for the metrics: ``malformed`` (no scores, not a number, a bad id),
    ``out_of_range`` or ``wrong_count``.
    """

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


SYSTEM_PROMPT = """\
You are a careful judge of an AI agent's work. You are shown several trajectories: attempts by the \
same agent at the same task. Score every trajectory from 0 to 1 against the rubric, comparing them \
with each other: a better trajectory gets a higher score. Use the whole range when they differ; \
give equal scores only when they are equally good. Judge the content, not the position: the order \
of the trajectories is random.

Reply with JSON only, in this shape, one entry per trajectory:
{"scores": [{"trajectory_id": 1, "explanation": "<one short sentence>", "score": 0.0}]}"""

SCORES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "trajectory_id": {"type": "integer"},
                    "explanation": {"type": "string"},
                    "score": {"type": "number"},
                },
                "required": ["trajectory_id", "explanation", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scores"],
    "additionalProperties": False,
}
"""The answer's shape, sent as ``response_format={"type": "json_schema", ...}`` where supported."""


def judge_messages(rubric: str, trajectories: Sequence[str]) -> list[dict[str, str]]:
    """The chat messages asking for scores of ``trajectories`` (already in this call's order), numbered from 1."""
    parts = [f"Rubric:\n{rubric}", f"There are {len(trajectories)} trajectories."]
    parts += [f'<trajectory id="{i}">\n{text}\n</trajectory>' for i, text in enumerate(trajectories, 1)]
    parts.append(f"Score each of the {len(trajectories)} trajectories from 0 to 1. Reply with JSON only.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)
_LINE = re.compile(r"trajectory[\s_#-]*(?:id\s*)?[\"']?(\d+)[\"']?[^0-9\n]*?[:=]\s*(-?\d+(?:\.\d+)?)", re.I)


def _json_candidates(text: str) -> list[str]:
    """Where JSON may be in ``text``: the whole, each fenced block, the outermost {...} and [...]."""
    out = [text.strip(), *(m.strip() for m in _FENCE.findall(text))]
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            out.append(text[start : end + 1])
    return out


def _load(text: str) -> Any:
    for candidate in _json_candidates(text):
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            continue
    return None


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise JudgeAnswerError(f"{where}: score {value!r} is not a number")
    try:
        score = float(value)
    except ValueError:
        raise JudgeAnswerError(f"{where}: score {value!r} is not a number") from None
    if math.isnan(score) or not 0.0 <= score <= 1.0:
        raise JudgeAnswerError(f"{where}: score {value!r} is outside [0, 1]", "out_of_range")
    return score


def _index(value: Any, n: int) -> int:
    """A trajectory id (1..n; an int, ``"2"`` or ``"trajectory 2"``) -> 0-based index."""
    match = re.search(r"\d+", str(value))
    if match is None or not 1 <= int(match.group()) <= n:
        raise JudgeAnswerError(f"trajectory id {value!r} is not one of 1..{n}")
    return int(match.group()) - 1


def _entries(data: Any) -> list[Any] | None:
    if isinstance(data, dict):
        table = cast(dict[str, Any], data)
        for key in ("scores", "trajectories", "results", "ratings"):
            if isinstance(table.get(key), list):
                return cast(list[Any], table[key])
        if table and all(re.search(r"\d", str(k)) for k in table):  # {"1": 0.2, "2": 0.9}
            return [{"trajectory_id": k, "score": v} for k, v in table.items()]
        return None
    if isinstance(data, list):
        return cast(list[Any], data)
    return None


def _from_entries(entries: list[Any], n: int) -> list[float]:
    if len(entries) != n:
        raise JudgeAnswerError(f"{len(entries)} scores for {n} trajectories", "wrong_count")
    scores: list[float | None] = [None] * n
    for position, entry in enumerate(entries):
        if isinstance(entry, dict):
            item = cast(dict[str, Any], entry)
            if "score" not in item:
                raise JudgeAnswerError(f"entry {position + 1} has no 'score'")
            ident = next((item[k] for k in ("trajectory_id", "id", "trajectory", "index") if k in item), None)
            index = position if ident is None else _index(ident, n)
            value = item["score"]
        else:
            index, value = position, entry
        if scores[index] is not None:
            raise JudgeAnswerError(f"trajectory {index + 1} is scored twice", "wrong_count")
        scores[index] = _number(value, f"trajectory {index + 1}")
    return [s for s in scores if s is not None]


def parse_scores(text: str, n: int) -> list[float]:
    """One score in [0, 1] per trajectory (index i: the trajectory numbered i + 1) from the judge's answer.

    Raises:
        JudgeAnswerError: no scores found, a score out of range or not a number, an unknown or repeated
            trajectory id, or not exactly ``n`` scores.
    """
    data = _load(text)
    entries = _entries(data) if data is not None else None
    if entries is not None:
        return _from_entries(entries, n)
    lines = _LINE.findall(text)
    if lines:
        return _from_entries([{"trajectory_id": i, "score": s} for i, s in lines], n)
    raise JudgeAnswerError(f"no scores found in the judge's answer: {text[:200]!r}")
