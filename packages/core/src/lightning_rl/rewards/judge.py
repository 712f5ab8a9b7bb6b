"""The group-relative judge: one HTTP call scores every trajectory of a group, robustly.

``GroupJudge.score_groups(groups)`` takes each group's rendered trajectories and returns one list
of scores in [0, 1] per group, or None for a group whose judging failed for good. None is never
turned into a score: the caller leaves that group out of the update and counts it.

What makes a judge usable in a training loop, where it is called thousands of times:

* **Position bias.** Each call presents the group in a fresh random order (scores are mapped back
  to the rollouts), so a judge that favours the first or last position spreads that favour at
  random instead of on the same rollout. ``two_passes`` asks again in the reverse order and
  averages: a linear position preference then cancels exactly.
* **Retries with backoff** after a timeout, a connection error, HTTP 429 or 5xx (``Retry-After``
  honoured), and after an answer that does not parse, is out of range or has the wrong number of
  scores. Other 4xx answers fail the group at once; 401, 403 and 404 stop the run
  (``JudgeRequestError``), since every later call would fail the same way.
* **Structured output** (a JSON-schema ``response_format``) where the endpoint takes it; with
  ``structured_output="auto"`` the first HTTP 400 turns it off for the rest of the run and the
  tolerant parser (``lightning_rl.rewards.prompt``) reads plain text.
* **A concurrency limit** on requests in flight, shared by all the groups of a step.
* **A disk cache** (``lightning_rl.rewards.cache``) consulted before any call.
* **Costs** (calls, retries, tokens, cache hits, failures by kind) accumulate in ``JudgeStats``.

With ``scoring="logprobs"`` (``lightning_rl.rewards.digits``, for small local judges) each distinct
trajectory of a group gets its own call asking for one digit, read from the top logprobs; the calls of
a group run concurrently under the same limit, with the same retries, and are cached one trajectory
at a time. A group is scored only when all its trajectories are: one trajectory failing for good
leaves the whole group out, as in the group mode. Such a call shows no order, so there is no position
bias to defend against; the judge grades on an absolute scale instead, and GRPO, which keeps only the
differences within a group, discards a judge's constant leniency or severity.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx

from lightning_rl.rewards.cache import JudgeCache, cache_key
from lightning_rl.rewards.config import JudgeConfig
from lightning_rl.rewards.digits import DIGIT_SYSTEM_PROMPT, TOP_LOGPROBS, digit_messages, digit_score
from lightning_rl.rewards.prompt import SCORES_SCHEMA, SYSTEM_PROMPT, JudgeAnswerError, judge_messages, parse_scores

__all__ = ["GroupJudge", "JudgeStats", "JudgeRequestError"]

log = logging.getLogger(__name__)

_FATAL_STATUS = (401, 403, 404)
_T = TypeVar("_T")


class JudgeRequestError(RuntimeError):
    """The judge's endpoint refused the request in a way no retry can fix (bad key, URL or model)."""


@dataclass
class JudgeStats:
    """What judging has cost and how it went, summed since the judge was built."""

    calls: int = 0
    """HTTP requests sent (retries included)."""
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    """As the endpoint's ``usage`` reports them (0 when it reports none)."""
    cache_hits: int = 0
    cache_misses: int = 0
    """Groups (``scoring="logprobs"``: distinct trajectories) answered from the cache / asked."""
    judged_groups: int = 0
    failed_groups: int = 0
    """Groups whose judging failed for good (left out of the update)."""
    errors: Counter[str] = field(default_factory=Counter[str])
    """Failed tries by kind: timeout, connection, http_429, http_5xx, http_4xx, malformed, out_of_range,
    wrong_count, structured_output_rejected, logprobs_rejected."""

    def copy(self) -> JudgeStats:
        return JudgeStats(
            self.calls,
            self.retries,
            self.prompt_tokens,
            self.completion_tokens,
            self.cache_hits,
            self.cache_misses,
            self.judged_groups,
            self.failed_groups,
            Counter(self.errors),
        )

    def since(self, before: JudgeStats) -> JudgeStats:
        """What changed since the snapshot ``before`` (one step's share)."""
        errors = Counter(self.errors)
        errors.subtract(before.errors)
        return JudgeStats(
            self.calls - before.calls,
            self.retries - before.retries,
            self.prompt_tokens - before.prompt_tokens,
            self.completion_tokens - before.completion_tokens,
            self.cache_hits - before.cache_hits,
            self.cache_misses - before.cache_misses,
            self.judged_groups - before.judged_groups,
            self.failed_groups - before.failed_groups,
            +errors,
        )

    def metrics(self, prefix: str) -> dict[str, float]:
        """The stats as ``{prefix}/judge_*`` metrics (errors as ``{prefix}/judge_errors/<kind>``)."""
        out = {
            f"{prefix}/judge_calls": float(self.calls),
            f"{prefix}/judge_retries": float(self.retries),
            f"{prefix}/judge_prompt_tokens": float(self.prompt_tokens),
            f"{prefix}/judge_completion_tokens": float(self.completion_tokens),
            f"{prefix}/judge_cache_hits": float(self.cache_hits),
            f"{prefix}/judge_cache_misses": float(self.cache_misses),
            f"{prefix}/judge_groups": float(self.judged_groups),
            f"{prefix}/judge_failed_groups": float(self.failed_groups),
        }
        out.update({f"{prefix}/judge_errors/{kind}": float(n) for kind, n in sorted(self.errors.items())})
        return out


class GroupJudge:
    """Scores groups of rendered trajectories with an OpenAI-compatible judge (see the module docstring).

    Args:
        config: The judge's settings.
        cache_dir: The cache folder when ``config.cache_dir`` is unset (the trainer passes
            ``<run_dir>/judge_cache``). Neither set, or ``config.cache`` false: no cache.
    """

    def __init__(self, config: JudgeConfig, *, cache_dir: str | Path | None = None) -> None:
        self.config = config
        folder = config.cache_dir or cache_dir
        self.cache = JudgeCache(folder) if config.cache and folder else None
        self.stats = JudgeStats()
        self._rng = random.Random(config.seed)
        self._structured = config.structured_output != "off"
        self._logprobs = True
        self._url = config.base_url.rstrip("/") + "/chat/completions"

    async def score_groups(self, groups: Sequence[Sequence[str]]) -> list[list[float] | None]:
        """Scores of each group's trajectories (in the order given), or None where judging failed for good.

        Raises:
            JudgeRequestError: the endpoint answered 401, 403 or 404.
        """
        limit = asyncio.Semaphore(self.config.concurrency)
        async with httpx.AsyncClient(timeout=self.config.timeout_s) as client:
            return list(await asyncio.gather(*(self._score(client, limit, list(g)) for g in groups)))

    async def _score(self, client: httpx.AsyncClient, limit: asyncio.Semaphore, texts: list[str]) -> list[float] | None:
        if not texts:
            return []
        if self.config.scoring == "logprobs":
            return await self._score_each(client, limit, texts)
        return await self._score_group(client, limit, texts)

    async def _score_group(
        self, client: httpx.AsyncClient, limit: asyncio.Semaphore, texts: list[str]
    ) -> list[float] | None:
        """``scoring="group"``: one call (two with ``two_passes``) shows the group in a random order."""
        cfg = self.config
        passes = 2 if cfg.two_passes else 1
        key = cache_key(
            texts,
            rubric=cfg.resolved_rubric,
            model=cfg.model,
            base_url=cfg.base_url,
            prompt=SYSTEM_PROMPT,
            passes=passes,
        )
        if self.cache is not None:
            cached = self.cache.get(key, len(texts))
            if cached is not None:
                self.stats.cache_hits += 1
                self.stats.judged_groups += 1
                return cached
            self.stats.cache_misses += 1
        order = list(range(len(texts)))
        self._rng.shuffle(order)
        orders = [order, order[::-1]] if cfg.two_passes else [order]
        totals = [0.0] * len(texts)
        for shown in orders:
            shown_texts = [texts[i] for i in shown]
            read = partial(_read_scores, n=len(shown_texts))
            scores = await self._call(client, limit, partial(self._body, shown_texts), read, "a group")
            if scores is None:
                self.stats.failed_groups += 1
                return None
            for position, index in enumerate(shown):
                totals[index] += scores[position]
        result = [t / len(orders) for t in totals]
        self.stats.judged_groups += 1
        if self.cache is not None:
            self.cache.put(key, result, model=cfg.model, passes=passes)
        return result

    async def _score_each(
        self, client: httpx.AsyncClient, limit: asyncio.Semaphore, texts: list[str]
    ) -> list[float] | None:
        """``scoring="logprobs"``: one call per distinct trajectory, concurrently (identical trajectories,
        common once a policy converges, are asked about once: the answer depends on the text alone)."""
        cfg = self.config
        distinct = list(dict.fromkeys(texts))
        keys = {
            text: cache_key(
                [text],
                rubric=cfg.resolved_rubric,
                model=cfg.model,
                base_url=cfg.base_url,
                prompt=DIGIT_SYSTEM_PROMPT,
                passes=1,
            )
            for text in distinct
        }
        found: dict[str, float] = {}
        for text in distinct:
            cached = self.cache.get(keys[text], 1) if self.cache is not None else None
            if cached is not None:
                self.stats.cache_hits += 1
                found[text] = cached[0]
            elif self.cache is not None:
                self.stats.cache_misses += 1
        asked = [text for text in distinct if text not in found]
        answers = await asyncio.gather(
            *(self._call(client, limit, partial(self._digit_body, t), digit_score, "a trajectory") for t in asked)
        )
        for text, score in zip(asked, answers, strict=True):
            if score is None:
                continue
            found[text] = score
            if self.cache is not None:  # a trajectory's score stands alone: kept even if its group fails
                self.cache.put(keys[text], [score], model=cfg.model, scoring="logprobs")
        if len(found) < len(distinct):
            self.stats.failed_groups += 1
            return None
        self.stats.judged_groups += 1
        return [found[text] for text in texts]

    def _digit_body(self, text: str) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": digit_messages(cfg.resolved_rubric, text),
            "temperature": cfg.temperature,
            "max_tokens": 1,
        }
        if self._logprobs:
            body["logprobs"] = True
            body["top_logprobs"] = TOP_LOGPROBS
        return body

    def _body(self, texts: Sequence[str]) -> dict[str, Any]:
        cfg = self.config
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": judge_messages(cfg.resolved_rubric, texts),
            "temperature": cfg.temperature,
            "max_tokens": cfg.max_tokens,
        }
        if self._structured:
            schema = {"name": "trajectory_scores", "strict": True, "schema": SCORES_SCHEMA}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
        return body

    def _headers(self) -> dict[str, str]:
        key = self.config.resolved_api_key()
        return {"authorization": f"Bearer {key}"} if key else {}

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        cfg = self.config
        if retry_after is not None:
            return min(max(retry_after, 0.0), cfg.max_backoff_s)
        return min(cfg.backoff_s * 2 ** (attempt - 1) * self._rng.uniform(0.5, 1.5), cfg.max_backoff_s)

    async def _call(
        self,
        client: httpx.AsyncClient,
        limit: asyncio.Semaphore,
        build: Callable[[], dict[str, Any]],
        read: Callable[[dict[str, Any]], _T],
        what: str,
    ) -> _T | None:
        """One judge request (its body from ``build``, rebuilt per try), retried; ``read`` turns the chat
        completion into the answer or raises ``JudgeAnswerError``. None once the retries are spent."""
        cfg = self.config
        last = ""
        retry_after: float | None = None
        for attempt in range(cfg.max_retries + 1):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(self._delay(attempt, retry_after))
            retry_after = None
            body: dict[str, Any] = {}
            try:
                async with limit:
                    body = build()  # once a slot is free: a fallback another call just took applies here
                    self.stats.calls += 1
                    response = await client.post(self._url, json=body, headers=self._headers())
            except httpx.TimeoutException as exc:
                last = self._failed("timeout", f"no answer within {cfg.timeout_s:g} s ({type(exc).__name__})")
                continue
            except httpx.TransportError as exc:
                last = self._failed("connection", f"{type(exc).__name__}: {exc}")
                continue
            status = response.status_code
            if status == 400 and "response_format" in body and cfg.structured_output == "auto":
                self._structured = False
                last = self._failed("structured_output_rejected", _error_text(response))
                log.info("the judge rejected response_format (HTTP 400); asking for plain JSON from now on")
                continue
            if status == 400 and body.get("logprobs") and "logprob" in _error_text(response).lower():
                self._logprobs = False
                last = self._failed("logprobs_rejected", _error_text(response))
                log.warning(
                    "the judge rejected logprobs (HTTP 400); reading its one-token text as the digit from now on"
                )
                continue
            if status == 429 or status >= 500:
                retry_after = _retry_after(response)
                last = self._failed(
                    "http_429" if status == 429 else "http_5xx", f"HTTP {status}: {_error_text(response)}"
                )
                continue
            if status in _FATAL_STATUS:
                raise JudgeRequestError(
                    f"the judge at {self._url} answered HTTP {status} ({_error_text(response)}); check "
                    f"judge.base_url, judge.model ({cfg.model!r}) and the key (judge.api_key or ${cfg.api_key_env})."
                )
            if status >= 400:
                self._failed("http_4xx", f"HTTP {status}: {_error_text(response)}")
                log.warning("judge call refused (HTTP %d: %s); the group is left out", status, _error_text(response))
                return None
            try:
                return read(self._completion(response))
            except JudgeAnswerError as exc:
                last = self._failed(exc.kind, str(exc))
        log.warning(
            "judging %s failed after %d tries (last: %s); the group is left out", what, cfg.max_retries + 1, last
        )
        return None

    def _failed(self, kind: str, message: str) -> str:
        self.stats.errors[kind] += 1
        log.debug("judge try failed (%s): %s", kind, message)
        return f"{kind}: {message}"

    def _completion(self, response: httpx.Response) -> dict[str, Any]:
        """The chat completion; its usage is counted on the way. A body that is not one is a malformed answer."""
        try:
            data: Any = response.json()
        except ValueError:
            raise JudgeAnswerError(f"the response body is not JSON: {response.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise JudgeAnswerError("the response body is not a chat completion")
        body = cast(dict[str, Any], data)
        usage = body.get("usage")
        if isinstance(usage, dict):
            counts = cast(dict[str, Any], usage)
            self.stats.prompt_tokens += int(counts.get("prompt_tokens") or 0)
            self.stats.completion_tokens += int(counts.get("completion_tokens") or 0)
        return body


def _read_scores(completion: dict[str, Any], n: int) -> list[float]:
    """The group mode's answer: ``n`` scores parsed from the message text."""
    try:
        content = completion["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise JudgeAnswerError("the response has no choices[0].message.content") from None
    if not isinstance(content, str) or not content.strip():
        raise JudgeAnswerError("the judge's answer is empty")
    return parse_scores(content, n)


def _error_text(response: httpx.Response) -> str:
    try:
        data: Any = response.json()
        message = cast(dict[str, Any], data.get("error") or {}).get("message") if isinstance(data, dict) else None
    except (ValueError, AttributeError):
        message = None
    return str(message or response.text[:200] or response.reason_phrase)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to the backoff
