"""The bundled corpus and its questions: a fictional world the agent must look facts up in.

A small fictional world plays Wikipedia, so no download is needed and no model knows the answers
by heart: people are born in towns and work for companies, companies have a head office in a town,
towns lie in countries. Each fact is one short paragraph of ``corpus.jsonl`` (bundled;
``python rag_data.py`` rebuilds it from the seed). People's names are made of random syllables, so
every name is new: a model can only find a person's facts by searching for the name it was asked
about, and only answer by copying the fact the search returned.

The questions are single-fact lookups ("Where was Moven born?"), two per person: at about a
million parameters the tiny local model can learn one search and one copy; MuSiQue's multi-hop
chains are the setting for a real model. Towns and companies are one word each, so an answer is a
short copy and token F1 is 1 or 0: a guess from memory scores the format bonus only.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Question",
    "CORPUS_PATH",
    "TOWNS",
    "COMPANIES",
    "RELATIONS",
    "build_corpus",
    "load_corpus",
    "make_questions",
    "person_names",
    "split",
]

CORPUS_PATH = Path(__file__).with_name("corpus.jsonl")
N_PEOPLE = 400
"""800 questions: enough for a few hundred training questions, 100+ held-out and 100 probe ones, each
set about different people."""

COUNTRIES = ["Morvania", "Quelland", "Saradis", "Tollemark", "Ustria", "Verdane"]
TOWNS = ["Tosk", "Bryn", "Calder", "Dunwick", "Eldham", "Farrow", "Glint", "Harth"] + [
    "Ivel",
    "Jarrow",
    "Kell",
    "Lorn",
    "Mirth",
    "Nolde",
    "Oster",
    "Pell",
]
COMPANIES = ["Brightwell", "Copperline", "Duskfield", "Emberstone", "Foxglove", "Greyhaven", "Hartwood", "Ironvale"]
RELATIONS = {"born_in": "Where was {person} born?", "works_for": "Who does {person} work for?"}
"""The two question templates, by the relation they ask about."""

# Name parts that the tiny model's tokenizer keeps whole (checked by the example's tests): a name is then
# mostly two or three tokens, a short copy.
_HEADS = "Ad Ar Be Co Di Do Er Ex Ge Go He Le Mo Mu Qu Re Se Sh St Th Tod Tot Val Wr Tas Fin Cal Kn".split()
_TAILS = (
    "ach ade ak ard ast ato ell en ep ex ig ile im ine ink ion ip ir ist ol om ong op ot ou ul um un ur us ut vi "
    "tur ven del gin lim tal wo"
).split()
_STOP_NAMES = frozenset({"a", "an", "the", "in", "is", "was", "for", "to", "and", "or", "who", "does", "work"})
"""Words a name must not be: the search drops stop words, and a question must read unambiguously."""


@dataclass(frozen=True)
class Question:
    """A single-fact question about ``person``, its answer, and the paragraph id that holds it."""

    question: str
    answer: str
    person: str
    relation: str
    support: int


def person_names(n: int, seed: int) -> list[str]:
    """``n`` distinct one-word names, a head and one or two tails (``Moven``, ``Reoptal``).

    Short, and made of whole tokens: the search query is the name copied from the question, and
    copying two or three tokens is what a model of a million parameters learns in minutes; a name of
    ten tokens takes far longer.
    """
    rng = random.Random(seed)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < n:
        name = rng.choice(_HEADS) + "".join(rng.choice(_TAILS) for _ in range(rng.choice((1, 2))))
        if name not in seen and name.lower() not in _STOP_NAMES:
            seen.add(name)
            names.append(name)
    return names


def build_corpus(seed: int = 7, n_people: int = N_PEOPLE) -> list[dict[str, object]]:
    """The fictional world as paragraphs: ``{"id", "title", "text", "subject", "relation", "object"}``."""
    rng = random.Random(seed)
    docs: list[dict[str, object]] = []

    def add(title: str, text: str, subject: str, relation: str, obj: str) -> None:
        docs.append(
            {"id": len(docs), "title": title, "text": text, "subject": subject, "relation": relation, "object": obj}
        )

    for town in TOWNS:
        country = rng.choice(COUNTRIES)
        add(town, f"{town} is a river town in the country of {country}.", town, "country", country)
    for company in COMPANIES:
        town = rng.choice(TOWNS)
        add(company, f"{company} is a firm with its head office in {town}.", company, "based_in", town)
    for person in person_names(n_people, seed):
        town, company = rng.choice(TOWNS), rng.choice(COMPANIES)
        add(person, f"{person} was born in {town}.", person, "born_in", town)
        add(person, f"{person} works for {company}.", person, "works_for", company)
    return docs


def load_corpus(path: Path = CORPUS_PATH) -> list[dict[str, object]]:
    """The bundled corpus (built from the seed if the file is missing)."""
    if not path.exists():
        return build_corpus()
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def make_questions(docs: list[dict[str, object]]) -> list[Question]:
    """One question per fact about a person (where they were born, whom they work for), in corpus order."""
    questions: list[Question] = []
    for d in docs:
        relation = str(d["relation"])
        if relation in RELATIONS:
            person = str(d["subject"])
            text = RELATIONS[relation].format(person=person)
            questions.append(Question(text, str(d["object"]), person, relation, int(str(d["id"]))))
    return questions


def split(
    questions: list[Question], n_val: int, seed: int = 0, n_probe: int = 0
) -> tuple[list[Question], list[Question], list[Question]]:
    """(training, held-out, probe) questions about disjoint sets of people, shuffled by ``seed``.

    Held-out and probe sets take whole people (both of their questions) until they hold ``n_val`` and
    ``n_probe`` questions, so no held-out name was ever searched for in training. Probe questions only
    check the warm start's skills.
    """
    people = sorted({q.person for q in questions})
    random.Random(seed).shuffle(people)
    by_person: dict[str, list[Question]] = {p: [] for p in people}
    for q in questions:
        by_person[q.person].append(q)
    val: list[Question] = []
    probe: list[Question] = []
    train: list[Question] = []
    for person in people:
        target = val if len(val) < n_val else probe if len(probe) < n_probe else train
        target.extend(by_person[person])
    random.Random(seed + 1).shuffle(train)
    return train, val, probe


if __name__ == "__main__":
    corpus = build_corpus()
    CORPUS_PATH.write_text("".join(json.dumps(d) + "\n" for d in corpus))
    print(f"wrote {len(corpus)} paragraphs to {CORPUS_PATH}; {len(make_questions(corpus))} questions")
