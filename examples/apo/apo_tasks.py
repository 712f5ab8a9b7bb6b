"""Short-answer questions for the APO example: each wants one word or number, nothing else.

The reward (``apo_agent.score``) compares the agent's answer with the expected one, so an agent whose
prompt makes it chatty ("Sure! The capital of France is Paris.") scores lower than one whose prompt
asks for the bare answer ("Paris"): the prompt matters, which is what APO optimises.
"""

from __future__ import annotations

from lightning_rl import Task

__all__ = ["QUESTIONS", "train_tasks", "val_tasks"]

QUESTIONS: list[tuple[str, str]] = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the capital of Kenya?", "Nairobi"),
    ("What is the capital of Peru?", "Lima"),
    ("What is the capital of Norway?", "Oslo"),
    ("How many legs does a spider have?", "8"),
    ("How many days are in a leap year?", "366"),
    ("How many sides does a hexagon have?", "6"),
    ("How many minutes are in two hours?", "120"),
    ("What is 12 times 12?", "144"),
    ("What is 81 divided by 9?", "9"),
    ("What is the chemical symbol of gold?", "Au"),
    ("What is the chemical symbol of sodium?", "Na"),
    ("Which planet is closest to the Sun?", "Mercury"),
    ("Which planet is known as the red planet?", "Mars"),
    ("What colour do you get by mixing blue and yellow?", "Green"),
    ("What is the opposite of 'north'?", "South"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Germany?", "Berlin"),
    ("How many hours are in a day?", "24"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What is the capital of Portugal?", "Lisbon"),
    ("How many continents are there?", "7"),
    ("What is 15 plus 27?", "42"),
    ("What is the chemical symbol of iron?", "Fe"),
    ("Which gas do plants take in from the air?", "CO2"),
    ("What is the capital of Greece?", "Athens"),
    ("How many weeks are in a year?", "52"),
    ("What is the freezing point of water in Celsius?", "0"),
]


def _task(i: int, question: str, answer: str) -> Task:
    return Task(input={"question": question, "answer": answer}, id=f"q{i}")


def train_tasks() -> list[Task]:
    """The first 24 questions: APO's batches are drawn from these."""
    return [_task(i, q, a) for i, (q, a) in enumerate(QUESTIONS[:24])]


def val_tasks() -> list[Task]:
    """The last 8 questions: the initial and the best prompt are scored on them."""
    return [_task(i, q, a) for i, (q, a) in enumerate(QUESTIONS[24:], start=24)]
