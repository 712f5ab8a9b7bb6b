"""Locally generated price questions with a checkable answer, and the reward that checks it.

A seeded catalogue of made-up items (``"blue kettle"``) with integer prices stands in for a private
database: the answer cannot be guessed, only looked up with the researcher's tool. Some questions
ask for an item that is not in the catalogue under that exact name (a typo), so the lookup fails
and the crew has to cope: those tool errors are the AIR signals the plugin records.
"""

from __future__ import annotations

import random
import re

from lightning_rl.types import Task

__all__ = ["CATALOGUE", "make_tasks", "score"]

_COLOURS = ("red", "blue", "green", "amber", "black", "white", "grey", "pink")
_THINGS = ("kettle", "lamp", "chair", "clock", "vase", "desk", "mug", "rug", "fan", "bell")


def _catalogue(seed: int = 1234) -> dict[str, int]:
    rng = random.Random(seed)
    return {f"{c} {t}": rng.randint(5, 95) for c in _COLOURS for t in _THINGS}


CATALOGUE: dict[str, int] = _catalogue()
"""item name -> price in euros (80 items)."""


def make_tasks(n: int, *, seed: int = 0, typo_rate: float = 0.2) -> list[Task]:
    """``n`` questions ``{"item", "asked_as", "answer"}``; ``asked_as`` has a typo with ``typo_rate``."""
    rng = random.Random(seed)
    items = sorted(CATALOGUE)
    tasks: list[Task] = []
    for _ in range(n):
        item = rng.choice(items)
        asked = item.replace(" ", "-") if rng.random() < typo_rate else item
        tasks.append(Task(input={"item": item, "asked_as": asked, "answer": CATALOGUE[item]}))
    return tasks


def score(text: str | None, answer: int) -> float:
    """1.0 when the last number in ``text`` is the price, else 0.0."""
    numbers = re.findall(r"-?\d+", text or "")
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0
