"""A generated encyclopedia of fictional people, places and organisations, and questions about it.

The RAG scenario's world, in place of the reference's MuSiQue over Wikipedia: nothing to
download, deterministic from a seed, and every answer checkable. Each split (train, val, test)
has its own entities, so its own corpus: an entity's name belongs to exactly one split (a hash
of the name decides, whatever the seed), and relations only link entities of the same split, so
no split shares a document with another.

Each entity has one short document. People have a birth year, a birthplace (a place), an
occupation and an employer (an organisation); places a country, a river, a founding year and a
population; organisations a kind, a founding year, a founder (a person) and a headquarters (a
place). A **1-hop** question asks for an attribute named in the entity's own document ("When was
Ilsa Morrow born?"); a **2-hop** question follows a relation first ("In which country was Ilsa
Morrow born?": her document names the town, the town's document names the country), and its
answer is checked not to appear in the first document, so it takes two retrievals.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from agentgrad.errors import InvalidInputError
from agentgrad.scenarios.rag.reward import normalize_answer

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SplitSize:
    """How many entities of each kind a split has (one document each)."""

    people: int
    places: int
    organisations: int


#: About 2,800 documents in all: a train corpus of 2,100, validation and test ones of 350 each.
SIZES = {"train": SplitSize(1400, 350, 350), "val": SplitSize(230, 60, 60), "test": SplitSize(230, 60, 60)}

_ONSETS = (
    "b",
    "br",
    "c",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "w",
    "z",
)
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou")
_CODAS = ("", "", "", "l", "n", "r", "s", "m", "th", "nd")
_PLACE_ENDINGS = ("mere", "ford", "holm", "wick", "gard", "stead", "ton", "vale", "port", "by")
_RIVER_ENDINGS = ("water", "brook", "flow", "run")
COUNTRIES = (
    "Arvenia",
    "Belmora",
    "Cassovar",
    "Dunmarch",
    "Eskeland",
    "Farrow Isles",
    "Galdria",
    "Hollin",
    "Istrevia",
    "Jorvast",
    "Kelmark",
    "Lorreth",
)
OCCUPATIONS = (
    "cartographer",
    "glassblower",
    "astronomer",
    "shipwright",
    "composer",
    "botanist",
    "engineer",
    "lawyer",
    "painter",
    "physician",
    "architect",
    "chemist",
    "novelist",
    "weaver",
    "surveyor",
)
#: An organisation's kind and the word its name ends with.
_KINDS = (
    ("shipyard", "Shipyard"),
    ("bank", "Bank"),
    ("observatory", "Observatory"),
    ("publishing house", "Press"),
    ("brewery", "Brewery"),
    ("orchestra", "Orchestra"),
    ("trading company", "Company"),
    ("foundry", "Foundry"),
    ("academy", "Academy"),
    ("guild", "Guild"),
)


@dataclass(frozen=True)
class Document:
    """One corpus entry: what the search tool indexes and returns."""

    id: str
    title: str
    text: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Question:
    """One task. ``support`` lists the documents the answer needs, in the order they are needed."""

    id: str
    question: str
    answer: str
    hops: int
    support: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "support": list(self.support)}


@dataclass(frozen=True)
class Split:
    """A split's corpus and every question that can be asked about it (in a seeded order)."""

    name: str
    seed: int
    documents: tuple[Document, ...]
    questions: tuple[Question, ...]

    @cached_property
    def by_id(self) -> dict[str, Document]:
        """The documents by id."""
        return {d.id: d for d in self.documents}


@dataclass
class _Person:
    name: str
    born: int
    occupation: str
    birthplace: _Place | None = None
    employer: _Organisation | None = None


@dataclass
class _Place:
    name: str
    country: str
    river: str
    founded: int
    population: int


@dataclass
class _Organisation:
    name: str
    kind: str
    founded: int
    founder: _Person
    headquarters: _Place


def split_of(name: str) -> str:
    """Which split an entity name belongs to: a hash, so splits are disjoint for every seed."""
    bucket = hashlib.sha256(name.encode()).digest()[0] % 10
    return "train" if bucket < 8 else ("val" if bucket == 8 else "test")


class _Names:
    """Unique invented names of one split (two entities never share one, within or across splits)."""

    def __init__(self, rng: random.Random, split: str) -> None:
        self.rng, self.split, self.used = rng, split, set[str]()

    def _word(self, syllables: int) -> str:
        parts = [
            self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS) for _ in range(syllables)
        ]
        return "".join(parts).capitalize()

    def draw(self, make: Callable[[], str]) -> str:
        while True:
            name = make()
            if name not in self.used and len(name) <= 28 and split_of(name) == self.split:
                self.used.add(name)
                return name

    def person(self) -> str:
        return self.draw(lambda: f"{self._word(self.rng.randint(1, 2))} {self._word(2)}")

    def place(self) -> str:
        return self.draw(lambda: self._word(self.rng.randint(1, 2)) + self.rng.choice(_PLACE_ENDINGS))

    def organisation(self, suffix: str) -> str:
        return self.draw(lambda: f"{self._word(2)} {suffix}")

    def river(self) -> str:
        return self.draw(lambda: self._word(1) + self.rng.choice(_RIVER_ENDINGS))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _person_doc(p: _Person) -> Document:
    assert p.birthplace is not None and p.employer is not None
    text = (
        f"{p.name} is a {p.occupation} born in {p.born} in {p.birthplace.name}. {p.name} works for {p.employer.name}."
    )
    return Document(f"person-{_slug(p.name)}", p.name, text)


def _place_doc(c: _Place) -> Document:
    text = (
        f"{c.name} is a town in {c.country} on the river {c.river}. "
        f"It was founded in {c.founded} and has {c.population} inhabitants."
    )
    return Document(f"place-{_slug(c.name)}", c.name, text)


def _organisation_doc(o: _Organisation) -> Document:
    text = (
        f"{o.name} is a {o.kind} founded in {o.founded} by {o.founder.name}. "
        f"It is headquartered in {o.headquarters.name}."
    )
    return Document(f"org-{_slug(o.name)}", o.name, text)


def _mentions(text: str, answer: str) -> bool:
    """True when ``answer`` occurs in ``text`` as whole words, after normalisation."""
    return f" {normalize_answer(answer)} " in f" {normalize_answer(text)} "


def generate_split(split: str, seed: int = 0) -> Split:
    """The corpus and questions of ``split``: deterministic in (split, seed)."""
    if split not in SPLITS:
        raise InvalidInputError(f"split must be one of {SPLITS}, got {split!r}")
    size = SIZES[split]
    rng = random.Random(f"rag:{seed}:{split}")
    names = _Names(rng, split)
    rivers = [names.river() for _ in range(max(4, size.places // 4))]
    places = [
        _Place(
            names.place(), rng.choice(COUNTRIES), rng.choice(rivers), rng.randint(900, 1750), rng.randint(800, 90000)
        )
        for _ in range(size.places)
    ]
    people = [_Person(names.person(), rng.randint(1800, 1990), rng.choice(OCCUPATIONS)) for _ in range(size.people)]
    organisations = []
    for _ in range(size.organisations):
        kind, suffix = rng.choice(_KINDS)
        organisations.append(
            _Organisation(
                names.organisation(suffix), kind, rng.randint(1750, 1990), rng.choice(people), rng.choice(places)
            )
        )
    for person in people:
        person.birthplace, person.employer = rng.choice(places), rng.choice(organisations)
    docs = (
        {id(p): _person_doc(p) for p in people}
        | {id(c): _place_doc(c) for c in places}
        | {id(o): _organisation_doc(o) for o in organisations}
    )
    questions = _questions(people, places, organisations, docs)
    rng.shuffle(questions)
    numbered = tuple(
        Question(f"{split}-{seed}-{i}", q.question, q.answer, q.hops, q.support) for i, q in enumerate(questions)
    )
    return Split(split, seed, tuple(docs.values()), numbered)


def _questions(
    people: list[_Person], places: list[_Place], organisations: list[_Organisation], docs: dict[int, Document]
) -> list[Question]:
    """Every question the templates ask of these entities; 2-hop ones whose answer the first
    document already gives are dropped (they would take one retrieval, not two)."""
    out: list[Question] = []

    def ask(text: str, answer: object, *path: object) -> None:
        support = tuple(docs[id(entity)] for entity in path)
        answer = str(answer)
        if len(support) == 2 and _mentions(support[0].text, answer):
            return
        out.append(Question("", text, answer, len(support), tuple(d.id for d in support)))

    for p in people:
        assert p.birthplace is not None and p.employer is not None
        ask(f"When was {p.name} born?", p.born, p)
        ask(f"Where was {p.name} born?", p.birthplace.name, p)
        ask(f"What is the occupation of {p.name}?", p.occupation, p)
        ask(f"Which organisation does {p.name} work for?", p.employer.name, p)
        ask(f"In which country was {p.name} born?", p.birthplace.country, p, p.birthplace)
        ask(f"Which river flows through the town where {p.name} was born?", p.birthplace.river, p, p.birthplace)
        ask(f"In which town is the employer of {p.name} headquartered?", p.employer.headquarters.name, p, p.employer)
        ask(f"In what year was the employer of {p.name} founded?", p.employer.founded, p, p.employer)
    for c in places:
        ask(f"In which country is {c.name}?", c.country, c)
        ask(f"Which river flows through {c.name}?", c.river, c)
        ask(f"In what year was {c.name} founded?", c.founded, c)
    for o in organisations:
        ask(f"Who founded {o.name}?", o.founder.name, o)
        ask(f"In which town is {o.name} headquartered?", o.headquarters.name, o)
        ask(f"In what year was {o.name} founded?", o.founded, o)
        ask(f"When was the founder of {o.name} born?", o.founder.born, o, o.founder)
        ask(f"What is the occupation of the founder of {o.name}?", o.founder.occupation, o, o.founder)
        ask(f"In which country is {o.name} headquartered?", o.headquarters.country, o, o.headquarters)
    return out
