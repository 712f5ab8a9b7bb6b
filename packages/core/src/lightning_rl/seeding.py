"""Sampling seeds derived from the run's seed, the rollout and the call, so ``--seed`` repeats a run.

Without them, the engine seeds every request that names no seed from OS randomness, and two runs of
one seed draw different tokens from their first call on: their curves differ for reasons no one can
inspect. An agent's code never passes a seed (and should not have to), so the gateway gives each
recorded call one, derived by hashing

- the run's seed,
- the rollout's id with the run's own prefix removed (the trainer names rollouts
  ``<run id>-s<step>-t<task>-<sample>``; the run id is random, so that two runs sharing a store never
  collide, and it must not reach the seed), and
- the call's index within its attempt (0, 1, 2 … in arrival order).

A call that sets ``seed`` itself keeps it. Calls of one attempt that run concurrently (an agent that
fans out) are numbered in arrival order, which may change from run to run: such agents repeat only
up to that order. A retried attempt starts counting from 0 again, so it replays the first attempt's
draws, which is what a retry after a crash should do.

Equal seeds give equal draws only when the logits are equal too; batch composition still changes
them by float rounding, which the trainer's deterministic mode removes (``TrainerConfig.deterministic``).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

__all__ = ["derive_seed", "CallSeeds"]

_MAX_ATTEMPTS = 100_000


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from ``parts``: stable across processes, machines and Python's hash seed."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


class CallSeeds:
    """Hands out the seed of each recorded call (see the module docstring).

    Args:
        seed: the run's seed.
        rollout_prefix: removed from the start of rollout ids before hashing (the trainer's run id and
            its separator); ids without it are hashed whole.
    """

    def __init__(self, seed: int, rollout_prefix: str = "") -> None:
        self.seed = seed
        self.rollout_prefix = rollout_prefix
        self._calls: OrderedDict[str, int] = OrderedDict()  # attempt id -> calls seen so far
        self._lock = threading.Lock()

    def next_seed(self, rollout_id: str, attempt_id: str | None) -> int:
        """The seed of the next call of ``attempt_id`` (of ``rollout_id``), counting it."""
        attempt = attempt_id or rollout_id
        with self._lock:
            index = self._calls.pop(attempt, 0)
            self._calls[attempt] = index + 1
            while len(self._calls) > _MAX_ATTEMPTS:  # attempts long ended: forget the oldest
                self._calls.popitem(last=False)
        return derive_seed(self.seed, rollout_id.removeprefix(self.rollout_prefix), index)
