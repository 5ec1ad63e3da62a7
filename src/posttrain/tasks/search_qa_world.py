"""The made-up world of `search-qa` (tasks/search_qa.py): its entities and their documents, generated from a seed and
indexed for BM25, and every question it supports (single-hop and two-hop) with the facts that answer it."""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from posttrain.tasks import bm25

N_PEOPLE, N_CITIES, N_COUNTRIES, N_FESTIVALS, N_COMPANIES = 64, 30, 10, 24, 24
ADJECTIVES = [
    "Blue",
    "Red",
    "Green",
    "Silver",
    "Golden",
    "Amber",
    "Crimson",
    "Quiet",
    "Bright",
    "Hidden",
    "Frozen",
    "Wild",
    "Iron",
    "Velvet",
    "Copper",
    "Jade",
    "Scarlet",
    "Hollow",
    "Misty",
    "Ivory",
    "Azure",
    "Rusty",
    "Lucky",
    "Silent",
    "Painted",
    "Sunken",
    "Merry",
    "Pale",
]
NOUNS = [
    "Lantern",
    "River",
    "Harvest",
    "Moon",
    "Kite",
    "Drum",
    "Feather",
    "Mask",
    "Candle",
    "Bell",
    "Fox",
    "Owl",
    "Tide",
    "Stone",
    "Garden",
    "Ribbon",
    "Comet",
    "Meadow",
    "Willow",
    "Crown",
    "Anchor",
    "Thistle",
    "Ember",
    "Orchard",
    "Sparrow",
    "Pebble",
    "Banner",
    "Falcon",
]
COMPANY_SUFFIXES = ["Labs", "Works", "Foods", "Motors", "Textiles"]
JOBS = ["baker", "sailor", "painter", "teacher", "farmer", "poet", "doctor", "weaver"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
EXAMPLE_QUERY = "Tovenar"  # the query in the prompt's example call: reserved, never an entity name

# Words of the document and question templates: generated names must not collide with them (BM25 would blur).
_TEMPLATE_WORDS = set(
    bm25.tokenize(
        " ".join(JOBS + MONTHS + COMPANY_SUFFIXES + ADJECTIVES + NOUNS)
        + " was born in is the mayor of founded works as"
        " a city country capital festival held takes place every company based by which who what where fact question"
    )
)


@dataclass
class Entity:
    kind: str  # person | city | country | festival | company
    name: str
    doc_id: str
    rel: dict[str, str] = field(default_factory=dict)  # relation -> target entity name
    text: str = ""


@dataclass
class World:
    entities: dict[str, Entity]  # by name
    index: bm25.Index

    def names(self, kind: str) -> list[str]:
        return [e.name for e in self.entities.values() if e.kind == kind]

    def doc(self, name: str) -> str:
        return self.entities[name].text


def _made_up_words(rng: random.Random, n: int, syllables: int, taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        w = "".join(
            rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") + (rng.choice("nrls") if rng.random() < 0.4 else "")
            for _ in range(syllables)
        )
        if len(w) >= 3 and w not in taken and w not in _TEMPLATE_WORDS:
            taken.add(w)
            out.append(w.capitalize())
    return out


def build_world(seed: int = 0) -> World:
    """The corpus: deterministic in `seed`. Every word of every name is unique in the corpus."""
    rng = random.Random(f"search-qa-world-{seed}")
    taken = {EXAMPLE_QUERY.lower()}
    first, last = _made_up_words(rng, N_PEOPLE, 1, taken), _made_up_words(rng, N_PEOPLE, 2, taken)
    people = [Entity("person", f"{f} {s}", f"person-{i}") for i, (f, s) in enumerate(zip(first, last))]
    cities = [Entity("city", w, f"city-{i}") for i, w in enumerate(_made_up_words(rng, N_CITIES, 2, taken))]
    countries = [Entity("country", w, f"country-{i}") for i, w in enumerate(_made_up_words(rng, N_COUNTRIES, 2, taken))]
    adjs, nouns = rng.sample(ADJECTIVES, N_FESTIVALS), rng.sample(NOUNS, N_FESTIVALS)
    festivals = [Entity("festival", f"{a} {n}", f"festival-{i}") for i, (a, n) in enumerate(zip(adjs, nouns))]
    companies = [
        Entity("company", f"{w} {rng.choice(COMPANY_SUFFIXES)}", f"company-{i}")
        for i, w in enumerate(_made_up_words(rng, N_COMPANIES, 2, taken))
    ]

    for i, city in enumerate(cities):  # every country gets cities; its first city is its capital
        country = countries[i % N_COUNTRIES]
        city.rel["country"] = country.name
        country.rel.setdefault("capital", city.name)
    mayors, founders = people[:N_CITIES], people[N_CITIES : N_CITIES + N_COMPANIES]
    for city, p in zip(cities, mayors):
        city.rel["mayor"], p.rel["mayor_of"] = p.name, city.name
    for co, p in zip(companies, founders):
        co.rel["founder"], p.rel["founded"] = p.name, co.name
        co.rel["based_in"] = rng.choice(cities).name
    for f in festivals:
        f.rel["held_in"], f.rel["month"] = rng.choice(cities).name, rng.choice(MONTHS)
    for p in people:
        p.rel["born_in"] = rng.choice(cities).name
        if "mayor_of" not in p.rel and "founded" not in p.rel:
            p.rel["job"] = rng.choice(JOBS)

    for p in people:
        role = (
            f"{p.name} is the mayor of {p.rel['mayor_of']}."
            if "mayor_of" in p.rel
            else f"{p.name} founded {p.rel['founded']}."
            if "founded" in p.rel
            else f"{p.name} works as a {p.rel['job']}."
        )
        p.text = f"{p.name} was born in {p.rel['born_in']}. {role}"
    capitals = {k.rel["capital"]: k.name for k in countries}
    for c in cities:
        c.text = f"{c.name} is a city in {c.rel['country']}. The mayor of {c.name} is {c.rel['mayor']}."
        if c.name in capitals:
            c.text += f" {c.name} is the capital of {capitals[c.name]}."
    for k in countries:
        k.text = f"{k.name} is a country. The capital of {k.name} is {k.rel['capital']}."
    for f in festivals:
        f.text = (
            f"The {f.name} festival is held in {f.rel['held_in']}. The {f.name} festival takes place every "
            f"{f.rel['month']}."
        )
    for co in companies:
        co.text = f"{co.name} is a company based in {co.rel['based_in']}. {co.name} was founded by {co.rel['founder']}."

    entities = {e.name: e for e in people + cities + countries + festivals + companies}
    index = bm25.build_index([(e.doc_id, e.text) for e in entities.values()])
    return World(entities=entities, index=index)


# relation -> (subject kind, target kind, single-hop question, noun phrase for the target, fact sentence)
RELATIONS: dict[str, tuple[str, str, str, str, str]] = {
    "held_in": (
        "festival",
        "city",
        "Which city is the {s} festival held in?",
        "the city where the {s} festival is held",
        "The {s} festival is held in {t}.",
    ),
    "based_in": (
        "company",
        "city",
        "Which city is {s} based in?",
        "the city where {s} is based",
        "{s} is based in {t}.",
    ),
    "born_in": ("person", "city", "Which city was {s} born in?", "the city where {s} was born", "{s} was born in {t}."),
    "capital": ("country", "city", "What is the capital of {s}?", "the capital of {s}", "The capital of {s} is {t}."),
    "founder": ("company", "person", "Who founded {s}?", "the founder of {s}", "{s} was founded by {t}."),
    "mayor": ("city", "person", "Who is the mayor of {s}?", "the mayor of {s}", "The mayor of {s} is {t}."),
    "country": ("city", "country", "Which country is {s} in?", "", "{s} is a city in {t}."),
}
# two-hop chains (r1 then r2); capital -> country is left out (it names the country asked about)
CHAINS = [
    ("held_in", "mayor"),
    ("held_in", "country"),
    ("based_in", "mayor"),
    ("based_in", "country"),
    ("born_in", "mayor"),
    ("born_in", "country"),
    ("capital", "mayor"),
    ("founder", "born_in"),
    ("mayor", "born_in"),
]


def all_questions(world: World, hops: Iterable[int] = (1, 2)) -> list[dict[str, Any]]:
    """Every question the world supports: {question, answer, answer_kind, hops, chain, facts}. `chain` is the
    entity names from subject to answer; `facts` the sentences that answer it."""
    hops = set(hops)
    if not hops or not hops <= {1, 2}:
        raise ValueError(f"hops must be a non-empty subset of (1, 2), got {sorted(hops)}")
    out = []

    def fact(r: str, s: str, t: str) -> str:
        return RELATIONS[r][4].format(s=s, t=t)

    for e in world.entities.values():
        for r, (kind, tkind, q, _, _) in RELATIONS.items():
            if e.kind != kind or r not in e.rel:
                continue
            t = e.rel[r]
            if 1 in hops:
                out.append(
                    {
                        "question": q.format(s=e.name),
                        "answer": t,
                        "answer_kind": tkind,
                        "hops": 1,
                        "chain": [e.name, t],
                        "facts": [fact(r, e.name, t)],
                    }
                )
            if 2 not in hops:
                continue
            for r1, r2 in CHAINS:
                if r1 != r:
                    continue
                u = world.entities[t].rel[r2]
                if u == e.name:  # e.g. the mayor of X was born in X: the question would name its answer
                    continue
                phrase = RELATIONS[r1][3].format(s=e.name)
                q2 = RELATIONS[r2][2].format(s=phrase)
                out.append(
                    {
                        "question": q2[0].upper() + q2[1:],
                        "answer": u,
                        "answer_kind": RELATIONS[r2][1],
                        "hops": 2,
                        "chain": [e.name, t, u],
                        "facts": [fact(r1, e.name, t), fact(r2, t, u)],
                    }
                )
    return out
