"""The ``logprobs`` scoring mode's prompt and answer: one trajectory, one digit, read from the logprobs.

A small local judge (SmolLM2-135M, the tiny model) never writes a valid JSON score list, so the
group mode gets nothing from it. What even a weak model does give is a next-token distribution: asked
for a single digit, it puts *some* probability on each digit, and that distribution says more than
the one digit it would sample. So each trajectory is judged alone, with ``max_tokens=1``,
``logprobs=true`` and ``top_logprobs=20``, and its score is the probability-weighted mean of the
digit tokens among the top tokens (renormalised over the digits), divided by 9: always a valid
number in [0, 1] once any digit is among them, and a smooth one (0.61, not 6 or 5), which gives
GRPO an order within a group even when the judge's best guess is the same for every trajectory.

No digit among the top tokens is a ``malformed`` answer (retried). An endpoint that ignores
``logprobs`` is read from its text: one digit 0-9 (a leading number outside 0-9 is ``out_of_range``).
Pure functions, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from lightning_rl.rewards.prompt import JudgeAnswerError

__all__ = [
    "DIGIT_SYSTEM_PROMPT",
    "TOP_LOGPROBS",
    "digit_messages",
    "digit_score",
    "score_from_top_logprobs",
    "score_from_text",
]

TOP_LOGPROBS = 20
"""How many top tokens are asked for: the most OpenAI's API (and the gateway) allows."""

DIGIT_SYSTEM_PROMPT = """\
You are a careful judge of an AI agent's work. You are shown one trajectory: an attempt by the agent \
at a task. Rate it against the rubric on a scale from 0 (fails the rubric completely) to 9 (meets it \
fully). Reply with a single digit from 0 to 9 and nothing else."""

_DIGITS = frozenset("0123456789")
_LEADING_NUMBER = re.compile(r"\s*(-?\d+(?:\.\d+)?)")


def digit_messages(rubric: str, trajectory: str) -> list[dict[str, str]]:
    """The chat messages asking for one digit about ``trajectory``; it is shown as trajectory 1, in the
    group mode's ``<trajectory id="1">`` block, so both modes render a trajectory the same way."""
    parts = [
        f"Rubric:\n{rubric}",
        f'<trajectory id="1">\n{trajectory}\n</trajectory>',
        "Rate the trajectory against the rubric from 0 (worst) to 9 (best). Reply with one digit only.",
    ]
    return [{"role": "system", "content": DIGIT_SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


def score_from_top_logprobs(entries: Sequence[Mapping[str, Any]]) -> float:
    """The probability-weighted mean digit among ``entries`` (``{"token", "logprob"}``), over 9.

    A token counts as digit ``d`` when its text, stripped of white space, is ``d`` (``"7"``, ``" 7"``);
    the probabilities of a digit's variants add up. Tokens that are not digits are ignored: the mean is
    renormalised over the digits.

    Raises:
        JudgeAnswerError: no digit among ``entries`` (``malformed``).
    """
    mass = [0.0] * 10
    for entry in entries:
        token, logprob = entry.get("token"), entry.get("logprob")
        if not isinstance(token, str) or token.strip() not in _DIGITS:
            continue
        if isinstance(logprob, bool) or not isinstance(logprob, int | float) or math.isnan(logprob):
            continue
        mass[int(token.strip())] += math.exp(min(float(logprob), 0.0))
    total = sum(mass)
    if total <= 0.0:
        tokens = [str(e.get("token")) for e in entries][:TOP_LOGPROBS]
        raise JudgeAnswerError(f"no digit among the judge's {len(entries)} top tokens: {tokens!r}")
    return sum(d * p for d, p in enumerate(mass)) / total / 9.0


def score_from_text(text: str | None) -> float:
    """The digit the judge wrote (an endpoint that ignored ``logprobs``), over 9.

    Raises:
        JudgeAnswerError: no leading number (``malformed``), or one that is not a digit 0-9 (``out_of_range``).
    """
    match = _LEADING_NUMBER.match(text or "")
    if match is None:
        raise JudgeAnswerError(f"the judge's answer is not a digit: {(text or '')[:200]!r}")
    value = match.group(1)
    if len(value) != 1:
        raise JudgeAnswerError(f"the judge's answer {value!r} is not a digit from 0 to 9", "out_of_range")
    return int(value) / 9.0


def digit_score(completion: Mapping[str, Any]) -> float:
    """The score in a chat completion answering ``digit_messages``: from the first token's top logprobs
    (or its own logprob when the endpoint lists no top tokens), else from the text.

    Raises:
        JudgeAnswerError: no choice, no digit among the top tokens, or a text that is not one digit.
    """
    try:
        choice = cast(dict[str, Any], completion["choices"][0])
    except (KeyError, IndexError, TypeError):
        raise JudgeAnswerError("the response has no choices[0]") from None
    logprobs = choice.get("logprobs")
    content = cast(dict[str, Any], logprobs).get("content") if isinstance(logprobs, dict) else None
    if isinstance(content, list) and content and isinstance(content[0], dict):
        first = cast(dict[str, Any], content[0])
        top = first.get("top_logprobs")
        entries = cast(list[Any], top) if isinstance(top, list) and top else [first]
        return score_from_top_logprobs([cast(dict[str, Any], e) for e in entries if isinstance(e, dict)])
    message = choice.get("message")
    text = cast(dict[str, Any], message).get("content") if isinstance(message, dict) else None
    return score_from_text(text if isinstance(text, str) else None)
