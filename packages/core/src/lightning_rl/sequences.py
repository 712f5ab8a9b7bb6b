"""One sequence per rollout: a rollout's calls concatenated, with the loss masked to the policy's own tokens.

LightningRL trains every model call as its own transition (its recorded prompt, its sampled
response). The usual way of training a multi-turn agent instead concatenates the whole interaction
into one long sequence and masks out the tokens the model did not write (tool results, the chat
template's markers). ``TrainerConfig(sequence="concatenated")`` trains that way from the same
recorded calls, so the two can be compared on the same rollouts (``benchmarks/beyond_imitation.py``).

How the sequence is built. Call ``i`` has the prompt ``p_i`` and the sampled response ``r_i``
(exact token ids). The sequence is ``p_1 + r_1 + o_2 + r_2 + ... + o_n + r_n``, the mask 1 on every
``r_i`` and 0 on every ``o_i``, where ``o_{i+1}``, what the next prompt adds after the previous turn,
is found in one of three ways (counted per join in ``JoinCounts``):

* **canonical**: ``p_{i+1}`` starts with ``p_i + r_i``: the template renders the previous turn back
  token for token, and ``o_{i+1}`` is the rest of ``p_{i+1}``. The sequence is then exactly the
  context each response was sampled in, and with a token-mean loss it trains what the per-call
  transitions train, in one forward pass instead of ``n``.
* **spliced**: ``p_{i+1}`` starts with ``p_i`` but not with ``p_i + r_i``: the template rendered the
  previous turn differently from what was sampled (other JSON spacing, a tool call in another
  syntax, a non-canonical token split; docs/models.md lists the cases for SmolLM2). ``o_{i+1}`` is
  what follows the first occurrence, after ``p_i``, of the token ``r_i`` ended with (the end of turn:
  the engine records it with the response, and a call not cut at ``max_tokens`` ends with it).
  The sampled tokens stand in for the template's rendering of the turn, so ``r_{i+1}`` is trained in a
  context that differs from the one it was sampled in: its sampling logprobs are then not those of
  that context (use ``old_logprobs="recompute"`` for a ratio that is).
* **split**: neither (the agent rewrote its history, or the call was cut at ``max_tokens``): the
  sequence ends with ``r_i`` and a new one starts at ``p_{i+1}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_rl.credit import RolloutSample
from lightning_rl.types import Transition

__all__ = ["JoinCounts", "concatenate_calls", "concatenate_samples"]


@dataclass
class JoinCounts:
    """How each pair of consecutive calls was joined (see the module docstring)."""

    canonical: int = 0
    spliced: int = 0
    split: int = 0

    def metrics(self, prefix: str = "train") -> dict[str, float]:
        """The counts as ``<prefix>/concat_<kind>_joins`` metrics."""
        return {f"{prefix}/concat_{k}_joins": float(v) for k, v in vars(self).items()}


def _observation(previous: Transition, following: Transition) -> tuple[list[int] | None, str]:
    """The tokens ``following``'s prompt adds after ``previous``'s turn, and how they were found."""
    prompt, response, nxt = previous.prompt_ids, previous.response_ids, following.prompt_ids
    done = len(prompt) + len(response)
    if nxt[:done] == [*prompt, *response]:
        return list(nxt[done:]), "canonical"
    # a call that was not cut at max_tokens ended with the engine's end-of-turn token
    if response and not previous.truncated and nxt[: len(prompt)] == prompt:
        rest = nxt[len(prompt) :]
        if response[-1] in rest:
            return list(rest[rest.index(response[-1]) + 1 :]), "spliced"
    return None, "split"


class _Builder:
    """One sequence under construction, started from a call."""

    def __init__(self, first: Transition) -> None:
        self.first = first
        self.response = list(first.response_ids)
        self.mask = [1] * len(first.response_ids)
        self.logprobs: list[float] | None = list(first.response_logprobs) if first.response_logprobs else None
        self.calls = [first]

    def add(self, observation: list[int], call: Transition) -> None:
        self.response += [*observation, *call.response_ids]
        self.mask += [0] * len(observation) + [1] * len(call.response_ids)
        if self.logprobs is not None and call.response_logprobs is not None:
            self.logprobs += [0.0] * len(observation) + list(call.response_logprobs)  # masked: never read
        else:
            self.logprobs = None
        self.calls.append(call)

    def build(self, index: int) -> Transition:
        calls = self.calls
        return self.first.model_copy(
            update={
                "response_ids": self.response,
                "response_logprobs": self.logprobs,
                "response_mask": self.mask,
                "reward": sum(c.reward for c in calls),  # the calls' intermediate (AIR) rewards
                "exact_tokens": all(c.exact_tokens for c in calls),
                "truncated": any(c.truncated for c in calls),
                "tool_call_ids": [i for c in calls for i in c.tool_call_ids],
                "step_index": index,
                "text": None,
            }
        )


def concatenate_calls(transitions: Sequence[Transition], counts: JoinCounts | None = None) -> list[Transition]:
    """A rollout's calls (in order) as one masked sequence, or several where a join had to split.

    Each result is a ``Transition`` whose response runs from the first call's response to the last
    one's, with ``response_mask`` 1 on sampled tokens and 0 on the tokens in between; its ``reward``
    is the sum of its calls' intermediate rewards. ``counts`` (when given) is incremented per join.
    """
    counts = counts if counts is not None else JoinCounts()
    out: list[Transition] = []
    current: _Builder | None = None
    previous: Transition | None = None
    for call in transitions:
        if current is None or previous is None:
            current = _Builder(call)
        else:
            observation, kind = _observation(previous, call)
            setattr(counts, kind, getattr(counts, kind) + 1)
            if observation is None:
                out.append(current.build(len(out)))
                current = _Builder(call)
            else:
                current.add(observation, call)
        previous = call
    if current is not None:
        out.append(current.build(len(out)))
    return out


def concatenate_samples(samples: Sequence[RolloutSample]) -> tuple[list[RolloutSample], JoinCounts]:
    """Every rollout's calls concatenated (``concatenate_calls``); the rewards and groups are unchanged."""
    counts = JoinCounts()
    joined = [
        RolloutSample(s.rollout_id, s.group_id, s.reward, concatenate_calls(s.transitions, counts)) for s in samples
    ]
    return joined, counts
