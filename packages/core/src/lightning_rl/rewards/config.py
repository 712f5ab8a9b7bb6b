"""The judge's settings: one documented dataclass, a field of ``TrainerConfig`` (``[algorithm.judge]``).

A run file turns the judge on with a table; every key is a field below::

    [algorithm.judge]
    base_url = "https://api.openai.com/v1"
    model = "gpt-4o-mini"
    rubric = "The answer is a single correct number."   # optional: DEFAULT_RUBRIC otherwise
    weight = 1.0                                         # optional: the judge alone
    scoring = "logprobs"                                 # optional: "group" (the default) or "logprobs"

The API key is never needed in the file: ``api_key_env`` names the environment variable that holds
it (and ``api_key``, when set anyway, is written as ``***`` to the run folder).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

__all__ = ["JudgeConfig", "DEFAULT_RUBRIC", "StructuredOutput", "Scoring", "SCORING_MODES"]

StructuredOutput = Literal["auto", "json_schema", "off"]
Scoring = Literal["group", "logprobs"]
SCORING_MODES: tuple[Scoring, ...] = ("group", "logprobs")
"""How the judge is asked (``JudgeConfig.scoring``)."""

DEFAULT_RUBRIC = """\
- A trajectory that achieves the task's goal scores higher than one that does not.
- Among those that achieve it, prefer the one that is correct, complete and efficient (fewer wasted
  calls, no errors, no invented facts).
- Among those that fail, give partial credit for progress towards the goal.
- Judge what the agent did and said, not how confident it sounds."""
"""What the judge is asked to reward when the run gives no rubric (after OpenPipe ART's RULER default)."""


@dataclass
class JudgeConfig:
    """A group-relative LLM judge (``lightning_rl.rewards``): what it asks, where, and how hard it tries."""

    model: str
    """The judge's model name at ``base_url`` (e.g. ``gpt-4o-mini``, or the name a local server lists)."""
    base_url: str = "https://api.openai.com/v1"
    """Any OpenAI-compatible endpoint, ending in ``/v1``."""
    api_key: str | None = None
    """The judge's API key. Better left unset: ``api_key_env`` is read instead."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the API key when ``api_key`` is unset (unset too: no key sent)."""
    rubric: str | None = None
    """What a good trajectory is, in the judge's words. None: ``DEFAULT_RUBRIC``."""
    scoring: Scoring = "group"
    """How the judge is asked. ``group``: one call shows the whole group and the judge writes a JSON
    score per trajectory (needs a model that writes valid JSON: a hosted one). ``logprobs``: one call
    per trajectory, asking for a single digit 0-9 (``max_tokens=1``, ``logprobs``, ``top_logprobs=20``);
    the score is the probability-weighted mean of the digits among the top tokens, over 9. Made for
    small local judges, which cannot write JSON but always put some probability on digits; an
    endpoint that ignores ``logprobs`` has its one text token read as the digit. ``structured_output``,
    ``max_tokens`` and ``two_passes`` do not apply to it (a call shows no order to cancel)."""
    weight: float = 1.0
    """How the judge's score ``s`` and the agent's own reward ``r`` make the reward GRPO sees:
    ``weight * s + (1 - weight) * r``. 1.0: the judge alone (the agent need not emit a reward);
    below 1, a rollout without its own reward is left out, as without a judge."""
    two_passes: bool = False
    """Ask twice, the second time in the reverse of the first (shuffled) order, and average: cancels
    a judge's preference for early or late positions, at twice the cost."""
    structured_output: StructuredOutput = "auto"
    """``json_schema``: send a JSON-schema ``response_format``. ``off``: do not (the tolerant parser
    reads the text). ``auto``: send it, and stop sending it once the endpoint rejects it (HTTP 400)."""
    temperature: float = 0.0
    max_tokens: int = 1024
    """Most tokens of one judge answer (one short explanation and a score per trajectory)."""
    timeout_s: float = 60.0
    """Limit of one judge request; a request past it is retried."""
    max_retries: int = 4
    """Retries of one judge call after a timeout, a connection error, HTTP 429 or 5xx, or an answer
    that does not parse (malformed, out of range, wrong number of scores). Past them, the group fails."""
    backoff_s: float = 1.0
    """First wait before a retry; doubled each time (with jitter), capped at ``max_backoff_s``. A
    ``Retry-After`` header is honoured up to the same cap."""
    max_backoff_s: float = 30.0
    concurrency: int = 4
    """Judge requests in flight at once (the groups of one step are judged concurrently)."""
    cache: bool = True
    """Keep each group's scores on disk, keyed by the rendered group, the rubric and the judge model:
    a rerun (or a resumed run) does not pay twice for the same group."""
    cache_dir: str | None = None
    """Where the cache lives. None: ``<run_dir>/judge_cache``."""
    text_limit: int = 1500
    """Characters kept of each message, response or tool text in a rendered trajectory."""
    seed: int = 0
    """Seeds the order shuffle (one new order per call)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("JudgeConfig.model is empty; name the judge's model, e.g. model = 'gpt-4o-mini'.")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"JudgeConfig.base_url must be an http(s) URL ending in /v1, got {self.base_url!r}.")
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(
                f"JudgeConfig.weight must be in [0, 1] (the judge's share of the reward), got {self.weight}."
            )
        if self.structured_output not in ("auto", "json_schema", "off"):
            raise ValueError(
                f"JudgeConfig.structured_output must be 'auto', 'json_schema' or 'off', got {self.structured_output!r}."
            )
        if self.scoring not in SCORING_MODES:
            raise ValueError(
                f"JudgeConfig.scoring must be 'group' (one JSON call per group) or 'logprobs' (one digit per "
                f"trajectory, for small judges), got {self.scoring!r}."
            )
        if self.scoring == "logprobs" and self.two_passes:
            raise ValueError(
                "JudgeConfig.two_passes applies to scoring='group' only: with scoring='logprobs' each call shows "
                "one trajectory, so there is no order to reverse; set two_passes = false."
            )
        for name in ("timeout_s", "max_tokens", "concurrency", "text_limit"):
            if getattr(self, name) <= 0:
                raise ValueError(f"JudgeConfig.{name} must be > 0, got {getattr(self, name)}.")
        if self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("JudgeConfig.max_retries, backoff_s and max_backoff_s must be >= 0.")
        if self.rubric is not None and not self.rubric.strip():
            raise ValueError("JudgeConfig.rubric is blank; give the rubric's text, or leave it out for the default.")

    @property
    def resolved_rubric(self) -> str:
        """The rubric the judge reads: the run's, else ``DEFAULT_RUBRIC``."""
        return self.rubric.strip() if self.rubric else DEFAULT_RUBRIC

    def resolved_api_key(self) -> str | None:
        """``api_key``, else the value of ``api_key_env`` (None when neither is set)."""
        return self.api_key or os.environ.get(self.api_key_env) or None
