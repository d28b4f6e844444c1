"""The embedded default dataset: a procedurally generated encyclopedia of fictional entities.

Four entity kinds — people, cities, organisations and works — carry typed attributes and relations
(a person is born in a city and works for an organisation; an organisation has a founder and a
headquarters city; a work has a creator). Every entity gets one encyclopedic passage. Questions come in
three kinds:

* ``attribute`` (one hop): *In what year was Tavel Orrinsk born?*
* ``bridge`` (two hops, through a relation): *In which country was the founder of Quorra Works born?*
* ``comparison`` (two entities): *Who was born earlier, Tavel Orrinsk or Mireth Vanscoe?*

Names are invented from syllables, so a model cannot answer from memory. Distractors make retrieval
precise work: families share surnames, some names differ by a single letter, and attribute values
(years, occupations, countries) repeat across entities.

Generation is a pure function of ``(seed, WORLD_VERSION, sizes)``: it uses only its own
``random.Random`` and ordered containers, so the same arguments give byte-identical output in any
process. ``WORLD_VERSION`` is bumped whenever the output changes; the env id's version follows it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from searchgym.data.types import Dataset, Passage, Question

__all__ = ["WORLD_VERSION", "WorldConfig", "generate_world"]

WORLD_VERSION = 1

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "h", "br", "dr", "th", "st"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "ae", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "sk", "nd", "v", "x", "m"]

_COUNTRIES = [
    ("Zenthar", "Republic of Zenthar"),
    ("Ovaria", "Kingdom of Ovaria"),
    ("Drelmont", "Free State of Drelmont"),
    ("Kasmere", "Union of Kasmere"),
    ("Pellwyn", "Commonwealth of Pellwyn"),
    ("Tirova", "Principality of Tirova"),
    ("Umbrask", "Federation of Umbrask"),
    ("Velquar", "Duchy of Velquar"),
]
_OCCUPATIONS = [
    "painter",
    "chemist",
    "novelist",
    "architect",
    "composer",
    "astronomer",
    "engineer",
    "cartographer",
    "botanist",
    "sculptor",
    "economist",
    "linguist",
]
_INDUSTRIES = [
    "shipbuilding",
    "publishing",
    "textile",
    "mining",
    "banking",
    "glassmaking",
    "railway",
    "pharmaceutical",
    "brewing",
    "clockmaking",
]
_ORG_SUFFIXES = ["Works", "Company", "Guild", "Foundry", "Consortium", "Institute", "Trading House", "Mills"]
_WORK_KINDS = [("novel", "wrote"), ("film", "directed"), ("opera", "composed"), ("atlas", "compiled")]
_GENRES = ["historical", "satirical", "romantic", "gothic", "pastoral", "experimental"]
_TITLE_ADJ = [
    "Silent",
    "Crimson",
    "Hollow",
    "Last",
    "Northern",
    "Gilded",
    "Broken",
    "Distant",
    "Pale",
    "Seventh",
]
_TITLE_NOUN = [
    "Harbour",
    "Lantern",
    "Orchard",
    "Tide",
    "Compass",
    "Meridian",
    "Archive",
    "Garden",
    "Bell",
    "Road",
]
_CITY_PREFIX = ["", "", "", "Port ", "New ", "Upper ", "Saint "]


@dataclass(frozen=True)
class WorldConfig:
    """Sizes of a generated world. The defaults give about 900 passages and several thousand questions."""

    seed: int = 0
    people: int = 360
    cities: int = 120
    organisations: int = 120
    works: int = 240
    test_questions: int = 1000
    validation_questions: int = 500


@dataclass
class _Entity:
    id: str
    kind: str
    name: str
    attrs: dict[str, object] = field(default_factory=dict)


class _NameMaker:
    """Draws unique invented names; a share of them are one-letter variants of earlier names."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int) -> str:
        parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
        return ("".join(parts) + self.rng.choice(_CODAS)).capitalize()

    def unique(self, make: object) -> str:
        assert callable(make)
        for _ in range(1000):
            name = str(make())
            if name not in self.used and name.lower() not in {"a", "an", "the"}:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted; lower the world sizes")

    def variant(self, name: str) -> str | None:
        """A near-duplicate of ``name`` (one vowel changed), or None if none is free."""
        positions = [i for i, ch in enumerate(name) if ch in "aeiou"]
        self.rng.shuffle(positions)
        for i in positions:
            for v in "aeiou":
                cand = name[:i] + v + name[i + 1 :]
                if cand != name and cand not in self.used:
                    self.used.add(cand)
                    return cand
        return None


def _make_entities(cfg: WorldConfig, rng: random.Random) -> dict[str, list[_Entity]]:
    names = _NameMaker(rng)
    cities = []
    for i in range(cfg.cities):
        name = names.unique(lambda: rng.choice(_CITY_PREFIX) + names.word(rng.choice([2, 3])))
        country = rng.choice(_COUNTRIES)
        cities.append(
            _Entity(f"city{i}", "city", name, {"country": country, "founded": rng.randint(820, 1750)})
        )

    surnames = [names.unique(lambda: names.word(rng.choice([2, 3]))) for _ in range(max(1, cfg.people // 3))]
    people: list[_Entity] = []
    for i in range(cfg.people):
        if people and rng.random() < 0.15:
            # Near-duplicate of an earlier person's full name: retrieval must match precisely.
            base = rng.choice(people).name
            name = names.variant(base) or names.unique(lambda: f"{names.word(2)} {rng.choice(surnames)}")
        else:
            name = names.unique(lambda: f"{names.word(2)} {rng.choice(surnames)}")
        people.append(
            _Entity(
                f"person{i}",
                "person",
                name,
                {
                    "born": rng.randint(1820, 1990),
                    "birthplace": rng.choice(cities),
                    "occupation": rng.choice(_OCCUPATIONS),
                    "pronoun": rng.choice(["He", "She", "They"]),
                },
            )
        )

    orgs = []
    for i in range(cfg.organisations):
        founder = rng.choice(people)
        style = rng.random()
        if style < 0.4:
            name = names.unique(lambda f=founder: f"{f.name.split()[-1]} {rng.choice(_ORG_SUFFIXES)}")
        else:
            name = names.unique(lambda: f"{names.word(rng.choice([2, 3]))} {rng.choice(_ORG_SUFFIXES)}")
        born = founder.attrs["born"]
        assert isinstance(born, int)
        orgs.append(
            _Entity(
                f"org{i}",
                "organisation",
                name,
                {
                    "founder": founder,
                    "founded": born + rng.randint(22, 55),
                    "headquarters": rng.choice(cities),
                    "industry": rng.choice(_INDUSTRIES),
                },
            )
        )
    for person in people:
        person.attrs["employer"] = rng.choice(orgs)

    works = []
    for i in range(cfg.works):
        creator = rng.choice(people)
        kind, verb = rng.choice(_WORK_KINDS)
        title = names.unique(
            lambda: rng.choice(
                [
                    f"The {rng.choice(_TITLE_ADJ)} {rng.choice(_TITLE_NOUN)} of {names.word(2)}",
                    f"{names.word(rng.choice([2, 3]))}",
                    f"The {names.word(2)} {rng.choice(_TITLE_NOUN)}",
                ]
            )
        )
        born = creator.attrs["born"]
        assert isinstance(born, int)
        works.append(
            _Entity(
                f"work{i}",
                "work",
                title,
                {
                    "creator": creator,
                    "kind": kind,
                    "verb": verb,
                    "year": born + rng.randint(20, 70),
                    "genre": rng.choice(_GENRES),
                },
            )
        )
    return {"person": people, "city": cities, "organisation": orgs, "work": works}


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _passage_text(e: _Entity, works_by_creator: dict[str, list[_Entity]]) -> str:
    a = e.attrs
    if e.kind == "person":
        place, org = a["birthplace"], a["employer"]
        assert isinstance(place, _Entity) and isinstance(org, _Entity)
        occupation = str(a["occupation"])
        text = (
            f"{e.name} (born {a['born']} in {place.name}) is {_a(occupation)}. "
            f"{a['pronoun']} {'work' if a['pronoun'] == 'They' else 'works'} for {org.name}."
        )
        made = works_by_creator.get(e.id, [])
        if made:
            listed = ", ".join(f"{w.name} ({w.attrs['year']})" for w in made[:3])
            text += f" {e.name.split()[0]} is known for {listed}."
        return text
    if e.kind == "city":
        country = a["country"]
        assert isinstance(country, tuple)
        return f"{e.name} is a city in the {country[1]}. It was founded in {a['founded']}."
    if e.kind == "organisation":
        founder, hq = a["founder"], a["headquarters"]
        assert isinstance(founder, _Entity) and isinstance(hq, _Entity)
        return (
            f"{e.name} is {_a(str(a['industry']))} organisation founded in {a['founded']} by {founder.name}. "
            f"Its headquarters are in {hq.name}."
        )
    creator = a["creator"]
    assert isinstance(creator, _Entity)
    return f"{e.name} is a {a['year']} {a['genre']} {a['kind']} by {creator.name}, who {a['verb']} it."


def _questions(ents: dict[str, list[_Entity]], rng: random.Random) -> list[Question]:
    qs: list[Question] = []

    def add(kind: str, text: str, answers: list[str], support: list[_Entity], sub: str) -> None:
        qs.append(
            Question(
                id="",
                question=text,
                golden_answers=tuple(dict.fromkeys(answers)),
                supporting_ids=tuple(dict.fromkeys(s.id for s in support)),
                kind=kind,
                hops=len({s.id for s in support}),
                metadata={"template": sub},
            )
        )

    def country_answers(city: _Entity) -> list[str]:
        c = city.attrs["country"]
        assert isinstance(c, tuple)
        return [c[0], c[1]]

    for p in ents["person"]:
        city, org = p.attrs["birthplace"], p.attrs["employer"]
        assert isinstance(city, _Entity) and isinstance(org, _Entity)
        founder = org.attrs["founder"]
        hq = org.attrs["headquarters"]
        assert isinstance(founder, _Entity) and isinstance(hq, _Entity)
        add("attribute", f"In what year was {p.name} born?", [str(p.attrs["born"])], [p], "person_born")
        add("attribute", f"In which city was {p.name} born?", [city.name], [p], "person_birthplace")
        add(
            "attribute",
            f"What is the occupation of {p.name}?",
            [str(p.attrs["occupation"])],
            [p],
            "person_job",
        )
        add("attribute", f"Which organisation does {p.name} work for?", [org.name], [p], "person_employer")
        add(
            "bridge",
            f"In which country was {p.name} born?",
            country_answers(city),
            [p, city],
            "person_country",
        )
        add(
            "bridge",
            f"In which city is the headquarters of the organisation {p.name} works for?",
            [hq.name],
            [p, org],
            "person_employer_hq",
        )
        if founder is not p:
            add(
                "bridge",
                f"Who founded the organisation that {p.name} works for?",
                [founder.name],
                [p, org],
                "person_employer_founder",
            )
    for o in ents["organisation"]:
        founder, hq = o.attrs["founder"], o.attrs["headquarters"]
        assert isinstance(founder, _Entity) and isinstance(hq, _Entity)
        add("attribute", f"Who founded {o.name}?", [founder.name], [o], "org_founder")
        add("attribute", f"In what year was {o.name} founded?", [str(o.attrs["founded"])], [o], "org_year")
        add("attribute", f"In which city is {o.name} headquartered?", [hq.name], [o], "org_hq")
        add(
            "bridge",
            f"In what year was the founder of {o.name} born?",
            [str(founder.attrs["born"])],
            [o, founder],
            "org_founder_born",
        )
        add(
            "bridge",
            f"In which country is {o.name} headquartered?",
            country_answers(hq),
            [o, hq],
            "org_country",
        )
    for w in ents["work"]:
        creator = w.attrs["creator"]
        assert isinstance(creator, _Entity)
        city = creator.attrs["birthplace"]
        assert isinstance(city, _Entity)
        add("attribute", f"Who created the {w.attrs['kind']} {w.name}?", [creator.name], [w], "work_creator")
        add(
            "attribute",
            f"In what year did the {w.attrs['kind']} {w.name} appear?",
            [str(w.attrs["year"])],
            [w],
            "work_year",
        )
        add(
            "bridge",
            f"In which city was the creator of {w.name} born?",
            [city.name],
            [w, creator],
            "work_creator_birthplace",
        )
    for c in ents["city"]:
        add("attribute", f"In which country is {c.name}?", country_answers(c), [c], "city_country")

    def pairs(items: list[_Entity], key: str, n: int) -> list[tuple[_Entity, _Entity]]:
        out = []
        for _ in range(n):
            x, y = rng.sample(items, 2)
            if x.attrs[key] != y.attrs[key]:
                out.append((x, y))
        return out

    n = len(ents["person"])
    for x, y in pairs(ents["person"], "born", n):
        first = x if x.attrs["born"] < y.attrs["born"] else y  # type: ignore[operator]
        add("comparison", f"Who was born earlier, {x.name} or {y.name}?", [first.name], [x, y], "cmp_people")
    for x, y in pairs(ents["organisation"], "founded", n // 2):
        first = x if x.attrs["founded"] < y.attrs["founded"] else y  # type: ignore[operator]
        add("comparison", f"Which was founded first, {x.name} or {y.name}?", [first.name], [x, y], "cmp_orgs")
    for x, y in pairs(ents["work"], "year", n // 2):
        first = x if x.attrs["year"] < y.attrs["year"] else y  # type: ignore[operator]
        add("comparison", f"Which appeared first, {x.name} or {y.name}?", [first.name], [x, y], "cmp_works")
    return qs


def generate_world(config: WorldConfig | None = None, **overrides: int) -> Dataset:
    """Generates the fictional encyclopedia.

    Args:
        config: Sizes and seed; ``WorldConfig()`` by default.
        **overrides: Field overrides for ``config``, e.g. ``generate_world(seed=3)``.

    Returns:
        A :class:`Dataset` named ``world-v{WORLD_VERSION}-seed{seed}`` with splits ``train``,
        ``validation`` and ``test``; questions are disjoint across splits (no question text repeats).
    """
    from dataclasses import replace

    cfg = replace(config or WorldConfig(), **overrides)
    rng = random.Random(f"searchgym-world-v{WORLD_VERSION}-{cfg.seed}")
    ents = _make_entities(cfg, rng)
    works_by_creator: dict[str, list[_Entity]] = {}
    for w in ents["work"]:
        creator = w.attrs["creator"]
        assert isinstance(creator, _Entity)
        works_by_creator.setdefault(creator.id, []).append(w)
    passages = [
        Passage(e.id, e.name, _passage_text(e, works_by_creator))
        for kind in ("person", "city", "organisation", "work")
        for e in ents[kind]
    ]
    questions = list({q.question: q for q in _questions(ents, rng)}.values())  # drop repeated texts
    rng.shuffle(questions)
    n_test, n_val = cfg.test_questions, cfg.validation_questions
    if n_test + n_val >= len(questions):
        raise ValueError(
            f"world too small: {len(questions)} questions for {n_test} test + {n_val} validation"
        )
    names = {
        "test": questions[:n_test],
        "validation": questions[n_test : n_test + n_val],
        "train": questions[n_test + n_val :],
    }
    splits = {split: [replace(q, id=f"{split}-{i}") for i, q in enumerate(qs)] for split, qs in names.items()}
    return Dataset(name=f"world-v{WORLD_VERSION}-seed{cfg.seed}", passages=passages, splits=splits)
