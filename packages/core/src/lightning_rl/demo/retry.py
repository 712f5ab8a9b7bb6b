"""One-operation calculator questions against a flaky tool: recovering from a failure no demonstration shows.

The second task of issue 41 (``benchmarks/beyond_imitation.py --task retry``). The demonstrations are
the one-operation ones of ``lightning_rl.demo.two_step``, recorded while the calculator always
answered: call it, then report its result. At training and test time the calculator fails
transiently on a share of the questions (``fail_rate``): its first call answers "error: the calculator
is busy right now (a transient failure); call it again" (``calculator.TransientToolError``), and the
same call made again succeeds. The reward is unchanged: the right number in the final answer.

Why this task after the two-operation one: there, a few more minutes of SFT on the few two-operation
demonstrations always beat GRPO from a shorter SFT (docs/beyond_imitation.md), and with too few of them
the SFT policy never sampled the second call, so RL had nothing to reinforce. Here imitation cannot
learn the recovery at any length, since no demonstration contains an error, while the move RL has to
find is one the SFT policy already makes on every question (a calculator call), now after a tool
message, and the error itself says to make it. How often the SFT policy samples that move is what
decides whether RL can start; ``beyond_imitation.py --calls`` counts it per step (two calls on a question
whose tool failed once is a retry).

``n_demo_two`` adds two-operation questions demonstrated turn by turn (``two_step_demonstrations``): a
call after a tool *result*, still never after an error, so the policy has a second call in its
repertoire without being shown when a failure calls for one.

The splits are deterministic in the seed: ``demo`` (the demonstrations' questions, never failing),
disjoint ``train``, ``val`` and ``test`` questions whose ``failures`` is 1 with probability ``fail_rate``,
else 0, and ``val_one``: the validation questions with a tool that never fails (how well a model
imitates the demonstrations, the sweep's tie-break). Numbers run from 2 to 15, as in the
demonstrations, which leaves 588 distinct one-operation questions for all the splits together.
"""

from __future__ import annotations

import random

from lightning_rl.demo.two_step import TwoStepSplits, make_chained_tasks
from lightning_rl.types import Task

__all__ = ["retry_splits", "with_failures"]


def with_failures(tasks: list[Task], *, fail_rate: float, seed: int) -> list[Task]:
    """``tasks`` with ``failures`` set to 1 (the tool's first call fails transiently) with probability
    ``fail_rate``, else 0, deterministic in ``seed``; ids gain ``-f`` where the tool fails.

    Raises:
        ValueError: ``fail_rate`` is outside [0, 1].
    """
    if not 0.0 <= fail_rate <= 1.0:
        raise ValueError(f"fail_rate must be in [0, 1], got {fail_rate}.")
    rng = random.Random(seed)
    out: list[Task] = []
    for task in tasks:
        failures = int(rng.random() < fail_rate)
        data = {**task.input, "failures": failures}
        out.append(task.model_copy(update={"id": f"{task.id}-f" if failures else task.id, "input": data}))
    return out


def retry_splits(
    seed: int,
    *,
    n_demo: int = 300,
    n_train: int = 100,
    n_val: int = 50,
    n_test: int = 100,
    fail_rate: float = 0.5,
    n_demo_two: int = 0,
) -> TwoStepSplits:
    """The splits of ``seed`` (see the module docstring). ``demo_two`` holds ``n_demo_two`` two-operation
    questions (``two_step_demonstrations`` shows them turn by turn: a call after a tool result, which
    none of the one-operation demonstrations shows); no demonstration shows a failure.

    Raises:
        ValueError: the splits ask for more than the 588 distinct questions, or ``fail_rate`` is outside [0, 1].
    """
    one = make_chained_tasks(n_demo + n_train + n_val + n_test, operations=1, seed=seed)
    demo, rest = one[:n_demo], one[n_demo:]
    flaky = with_failures(rest, fail_rate=fail_rate, seed=seed + 20_000)
    train, val, test = flaky[:n_train], flaky[n_train : n_train + n_val], flaky[n_train + n_val :]
    val_one = with_failures(rest[n_train : n_train + n_val], fail_rate=0.0, seed=seed)
    two = make_chained_tasks(n_demo_two, operations=2, seed=seed + 10_000) if n_demo_two else []
    return TwoStepSplits(demo, train, val, test, val_one, two)
