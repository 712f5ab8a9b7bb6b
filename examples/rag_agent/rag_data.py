"""The bundled corpus and its multi-hop questions: a scaled-down stand-in for MuSiQue.

MuSiQue questions need two to four retrieval hops over Wikipedia paragraphs. Here a small fictional
world plays Wikipedia (so no download is needed and no model knows the answers by heart): people
are born in cities and work for companies, companies are based in cities, cities lie in countries.
Each fact is one short paragraph of ``corpus.jsonl`` (bundled; ``python rag_data.py`` rebuilds it
from the seed). Questions are composed from chains of facts, so answering one takes two or three
searches: "In which country was Alira Venn born?" needs Alira Venn's city, then that city's country.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Question", "CORPUS_PATH", "build_corpus", "load_corpus", "make_questions", "split"]

CORPUS_PATH = Path(__file__).with_name("corpus.jsonl")

_FIRST = [
    "Alira",
    "Brannoc",
    "Cesia",
    "Dovan",
    "Elsin",
    "Farro",
    "Gwenna",
    "Halvar",
    "Isolde",
    "Jorrit",
    "Kestra",
    "Lunet",
    "Maddoc",
    "Nerys",
    "Orrin",
    "Pella",
    "Quill",
    "Rosmer",
    "Saffi",
    "Tamsin",
]
_LAST = ["Venn", "Ashdown", "Corvel", "Dunmere", "Estray", "Fallow", "Grendt", "Hollis", "Ivarne", "Jessop"]
_COUNTRIES = ["Morvania", "Quelland", "Saradis", "Tollemark", "Ustria", "Verdane"]
_CITIES = ["Tosk", "Bryn", "Calder", "Dunwick", "Eldham", "Farrow", "Glint", "Harth", "Ivel", "Jarrow", "Kell", "Lorn"]
_COMPANIES = [
    "Brightwell Mills",
    "Copperline",
    "Duskfield Press",
    "Emberstone",
    "Foxglove Labs",
    "Greyhaven Tools",
    "Hartwood Foods",
    "Ironvale",
]


@dataclass(frozen=True)
class Question:
    """A multi-hop question, its answer, and the paragraph ids it needs (its supporting facts)."""

    question: str
    answer: str
    hops: int
    support: tuple[int, ...]


def build_corpus(seed: int = 7) -> list[dict[str, object]]:
    """The fictional world as paragraphs: ``{"id", "title", "text", "subject", "relation", "object"}``."""
    rng = random.Random(seed)
    docs: list[dict[str, object]] = []

    def add(title: str, text: str, subject: str, relation: str, obj: str) -> None:
        docs.append(
            {"id": len(docs), "title": title, "text": text, "subject": subject, "relation": relation, "object": obj}
        )

    for city in _CITIES:
        country = rng.choice(_COUNTRIES)
        add(city, f"{city} is a river town in the country of {country}.", city, "country", country)
    for company in _COMPANIES:
        city = rng.choice(_CITIES)
        add(company, f"{company} is a firm with its head office in {city}.", company, "based_in", city)
    people = [f"{first} {last}" for first in _FIRST for last in _LAST]
    rng.shuffle(people)
    for person in people[:40]:
        city, company = rng.choice(_CITIES), rng.choice(_COMPANIES)
        add(person, f"{person} was born in {city}.", person, "born_in", city)
        add(person, f"{person} works for {company}.", person, "works_for", company)
    return docs


def load_corpus(path: Path = CORPUS_PATH) -> list[dict[str, object]]:
    """The bundled corpus (built from the seed if the file is missing)."""
    if not path.exists():
        return build_corpus()
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def make_questions(docs: list[dict[str, object]]) -> list[Question]:
    """Every 2-hop and 3-hop question the corpus supports, in a fixed order."""
    fact = {(str(d["subject"]), str(d["relation"])): d for d in docs}
    questions: list[Question] = []
    for d in docs:
        subject, relation, obj = str(d["subject"]), str(d["relation"]), str(d["object"])
        if relation == "born_in":
            country = fact[(obj, "country")]
            questions.append(
                Question(
                    f"In which country was {subject} born?",
                    str(country["object"]),
                    2,
                    (int(str(d["id"])), int(str(country["id"]))),
                )
            )
        elif relation == "works_for":
            base = fact[(obj, "based_in")]
            questions.append(
                Question(
                    f"In which town is the head office of {subject}'s employer?",
                    str(base["object"]),
                    2,
                    (int(str(d["id"])), int(str(base["id"]))),
                )
            )
            country = fact[(str(base["object"]), "country")]
            questions.append(
                Question(
                    f"In which country is the head office of {subject}'s employer?",
                    str(country["object"]),
                    3,
                    (int(str(d["id"])), int(str(base["id"])), int(str(country["id"]))),
                )
            )
    return questions


def split(questions: list[Question], n_val: int, seed: int = 0) -> tuple[list[Question], list[Question]]:
    """A shuffled train / held-out split."""
    shuffled = list(questions)
    random.Random(seed).shuffle(shuffled)
    return shuffled[n_val:], shuffled[:n_val]


if __name__ == "__main__":
    corpus = build_corpus()
    CORPUS_PATH.write_text("".join(json.dumps(d) + "\n" for d in corpus))
    print(f"wrote {len(corpus)} paragraphs to {CORPUS_PATH}; {len(make_questions(corpus))} questions")
