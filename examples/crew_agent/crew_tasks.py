"""Locally generated price questions with a checkable answer, and the reward that checks it.

A seeded catalogue of made-up items (``"blue kettle"``: 20 colours x 16 things, 320 items) with
two-digit prices stands in for a private database: a price cannot be guessed, only looked up with
the researcher's tool. ``split_items`` deals the *items* (not just the questions) out to training,
held-out and probe sets, so a held-out question is about an item the model never saw in training:
remembering training prices cannot help there, only the tool can.

Some questions misspell the item (``"pink-desk"`` for ``"pink desk"``). The catalogue only knows the
exact name, so looking the misspelling up is a tool error, which the plugin records as an AIR
``tool_error`` signal; the error names the closest item, which the researcher can look up next.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_rl.types import Task

__all__ = ["CATALOGUE", "COLOURS", "THINGS", "ItemSplit", "split_items", "make_tasks", "misspell", "score"]

COLOURS = (
    "red", "blue", "green", "amber", "black", "white", "grey", "pink", "teal", "gold",
    "silver", "olive", "navy", "coral", "ivory", "plum", "rust", "jade", "lime", "mint",
)  # fmt: skip
THINGS = (
    "kettle", "lamp", "chair", "clock", "vase", "desk", "mug", "rug",
    "fan", "bell", "bowl", "sofa", "stool", "jug", "tray", "shelf",
)  # fmt: skip


def _catalogue(seed: int = 1234) -> dict[str, int]:
    rng = random.Random(seed)
    return {f"{c} {t}": rng.randint(10, 99) for c in COLOURS for t in THINGS}


CATALOGUE: dict[str, int] = _catalogue()
"""item name -> price in euros (320 items, prices 10-99)."""


@dataclass(frozen=True)
class ItemSplit:
    """Disjoint item names for training, held-out validation, and the warm start's skill probes."""

    train: list[str]
    val: list[str]
    probe: list[str]


def split_items(*, seed: int, n_val: int = 100, n_probe: int = 40) -> ItemSplit:
    """Shuffle the catalogue with ``seed`` and deal ``n_val`` held-out and ``n_probe`` probe items; the rest train.

    Raises:
        ValueError: fewer than one training item would be left.
    """
    items = sorted(CATALOGUE)
    if n_val + n_probe >= len(items):
        raise ValueError(f"the catalogue has {len(items)} items; ask for fewer than that held-out and probe items.")
    random.Random(seed).shuffle(items)
    return ItemSplit(train=items[n_val + n_probe :], val=items[:n_val], probe=items[n_val : n_val + n_probe])


def misspell(item: str) -> str:
    """The one typo the questions make: a hyphen for the space (``"pink-desk"``)."""
    return item.replace(" ", "-")


def make_tasks(items: Sequence[str], n: int | None = None, *, seed: int, typo_rate: float = 0.2) -> list[Task]:
    """Questions ``{"item", "asked_as", "answer"}`` about ``items``: each item once in order (``n`` None),
    or ``n`` questions cycling through the items; ``asked_as`` is misspelt with ``typo_rate``."""
    rng = random.Random(seed)
    count = len(items) if n is None else n
    tasks: list[Task] = []
    for i in range(count):
        item = items[i % len(items)]
        asked = misspell(item) if rng.random() < typo_rate else item
        tasks.append(Task(id=f"{i}:{asked}", input={"item": item, "asked_as": asked, "answer": CATALOGUE[item]}))
    return tasks


def score(text: str | None, answer: int) -> float:
    """1.0 when the last number in ``text`` is the price, else 0.0."""
    numbers = re.findall(r"-?\d+", text or "")
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0
