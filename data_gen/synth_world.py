"""The synthetic corpus's world: an invented, typed entity inventory and one consistent knowledge base.

Everything is a pure function of (seed, n_persons): names are built from syllables (so a small model
cannot guess them from pretraining), and every fact (birthplace, employer, spouse, parents, works, ...)
is fixed once, so documents that mention the same entities state the same facts. Persons come in
families of four (father, mother, two children) sharing a family name.
"""

from __future__ import annotations

import dataclasses
import random

RELATIONS: dict[str, str] = {
    "P569": "date of birth", "P570": "date of death", "P19": "place of birth", "P20": "place of death",
    "P27": "country of citizenship", "P69": "educated at", "P108": "employer", "P26": "spouse", "P22": "father",
    "P25": "mother", "P40": "child", "P3373": "sibling", "P166": "award received",
    "P102": "member of political party", "P800": "notable work", "P463": "member of",
    "P159": "headquarters location", "P571": "inception", "P112": "founded by", "P17": "country",
    "P488": "chairperson", "P749": "parent organization", "P131": "located in the administrative territorial entity",
    "P1376": "capital of", "P36": "capital", "P37": "official language", "P30": "continent",
    "P150": "contains administrative territorial entity", "P175": "performer", "P50": "author", "P57": "director",
    "P577": "publication date", "P264": "record label", "P123": "publisher", "P495": "country of origin",
    "P364": "original language of work",
}
"""The 36 DocRED relations the synthetic corpus uses (labels as in DocRED's rel_info.json)."""

INVERSE: dict[str, str] = {"P22": "P40", "P25": "P40", "P26": "P26", "P3373": "P3373", "P36": "P1376",
                           "P1376": "P36", "P150": "P131", "P175": "P800", "P50": "P800", "P57": "P800"}
"""Stating (a, r, b) also annotates (b, INVERSE[r], a), as DocRED annotates both directions."""

PHRASE_RELATIONS: dict[str, tuple[str, str]] = {
    # phrase: (subject pool, object pool); a pool is "person", "city", "country", "company", "club" or "novel"
    "mentor": ("person", "person"), "rival": ("person", "person"), "best friend": ("person", "person"),
    "doctor": ("person", "person"), "lawyer": ("person", "person"), "agent": ("person", "person"),
    "training partner": ("person", "person"), "favourite city": ("person", "city"), "bank": ("person", "company"),
    "main sponsor": ("person", "company"), "main rival": ("company", "company"),
    "largest customer": ("company", "company"), "auditor": ("company", "company"),
    "spokesperson": ("company", "person"), "biggest market": ("company", "country"),
    "dedicatee": ("novel", "person"), "cover artist": ("novel", "person"), "editor": ("novel", "person"),
    "best known resident": ("city", "person"), "largest company": ("country", "company"),
    "biggest trading partner": ("country", "country"), "home club": ("person", "club"),
    # held out (HELDOUT_PHRASES): no training document states them
    "biographer": ("person", "person"), "first teacher": ("person", "person"),
    "favourite novel": ("person", "novel"), "main supplier": ("company", "company"),
    "legal adviser": ("company", "person"), "translator": ("novel", "person"), "main employer": ("city", "company"),
    "national hero": ("country", "person"),
}
"""Relations outside DocRED's 96 labels, named by a phrase the sentence states ("X's mentor was Y"): the memory-write
model writes the phrase as the relation (`X>>mentor>>Y`) and the memory matches it by embedding. Off unless a
`World` is built with `phrases`."""

HELDOUT_PHRASES: frozenset[str] = frozenset({"biographer", "first teacher", "favourite novel", "main supplier",
                                             "legal adviser", "translator", "main employer", "national hero"})
"""Phrase relations held out by relation: only the held-out and edit worlds state them (`TRAIN_PHRASES` the
others)."""

TRAIN_PHRASES: tuple[str, ...] = tuple(p for p in PHRASE_RELATIONS if p not in HELDOUT_PHRASES)
PHRASE_SHARE = 0.5
"""Chance that an entity of a phrase relation's subject pool has a fact of it."""


def phrase_id(phrase: str) -> str:
    """The relation id of a phrase relation (as `RELATIONS`' P-ids; DocRED documents' `r`): "phrase:best_friend"."""
    return "phrase:" + phrase.replace(" ", "_")


def is_phrase_id(relation_id: str) -> bool:
    """Whether a relation id (`phrase_id`) names a phrase relation."""
    return relation_id.startswith("phrase:")


_ONSETS = "b br d dr f g gr k kl l m n p pr r s st t tr v z th sh".split()
_VOWELS = "a e i o u ai ei ou ae".split()
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "k"]
MONTHS = "January February March April May June July August September October November December".split()
ORG_KINDS = ("university", "company", "label", "publisher", "party", "club")
WORK_KINDS = (("album", "P175", "P264"), ("novel", "P50", "P123"), ("film", "P57", "P123"))


@dataclasses.dataclass
class Ent:
    key: str
    name: str
    type: str
    """DocRED type: PER, ORG, LOC, TIME, MISC."""
    kind: str = ""
    gender: str = "n"
    facts: dict = dataclasses.field(default_factory=dict)
    """pid -> entity key or list of keys (the entity is the subject)."""


class World:
    """`exclude_names`: names another world already uses (a held-out world built with the training world's
    names excluded shares no entity with it; only dates and years can coincide)."""

    def __init__(self, seed: int | str = 0, n_persons: int = 400, exclude_names: frozenset[str] = frozenset(),
                 phrases: tuple[str, ...] = ()):
        self.seed = seed
        self.phrases = tuple(phrases)
        self.rng = random.Random(f"memllm-world:{seed}")
        self.ents: dict[str, Ent] = {}
        self._names: set[str] = set()
        self._taken = set(exclude_names)
        n_persons = max(8, n_persons - n_persons % 4)
        n_countries = max(4, n_persons // 60)
        n_cities = max(12, n_persons // 6)
        n_orgs = max(2 * len(ORG_KINDS), n_persons // 4)
        n_works = max(6, n_persons // 2)
        rng = self.rng
        self.continents = [self._add("cont", i, self._word(3) + "a", "LOC") for i in range(3)]
        self.countries = [self._add("country", i, self._word(2) + rng.choice(["ia", "land", "stan", "or"]), "LOC")
                          for i in range(n_countries)]
        self.languages = [self._add("lang", i, self._word(2) + rng.choice(["ese", "ic", "ian", "ish"]), "MISC")
                          for i in range(n_countries)]
        self.regions = [self._add("region", i, self._word(2) + " " + rng.choice(["Province", "County", "Valley"]), "LOC")
                        for i in range(2 * n_countries)]
        self.cities = [self._add("city", i, self._word(rng.choice([2, 3])), "LOC") for i in range(n_cities)]
        for i, c in enumerate(self.countries):
            c.facts.update(P30=self.continents[i % 3].key, P37=self.languages[i].key,
                           P36=self.cities[i].key, P150=[self.regions[2 * i].key, self.regions[2 * i + 1].key])
        for r_i, r in enumerate(self.regions):
            r.facts["P17"] = self.countries[r_i // 2].key
        for i, city in enumerate(self.cities):
            country = i % n_countries
            city.facts.update(P17=self.countries[country].key, P131=self.regions[2 * country + (i // n_countries) % 2].key)
            if i < n_countries:
                city.facts["P1376"] = self.countries[i].key
        self.years = {}
        self.dates = {}
        self.awards = [self._add("award", i, "the " + self._word(2) + " " + rng.choice(["Prize", "Medal", "Award"]), "MISC")
                       for i in range(max(4, n_persons // 40))]
        self.orgs_by_kind: dict[str, list[Ent]] = {k: [] for k in ORG_KINDS}
        for i in range(n_orgs):
            kind = ORG_KINDS[i % len(ORG_KINDS)]
            self.orgs_by_kind[kind].append(self._add("org", i, self._org_name(kind), "ORG", kind=kind))
        self.persons: list[Ent] = []
        for f in range(n_persons // 4):
            family = self._word(rng.choice([2, 3]))
            base = rng.randint(1890, 1960)
            for j in range(4):
                gender = "m" if j in (0, 2) or (j == 3 and rng.random() < .5) else "f"
                p = self._add("per", 4 * f + j, self._given(gender) + " " + family, "PER", gender=gender)
                p.facts["birth_year"] = base + (0 if j < 2 else rng.randint(22, 34))
                self.persons.append(p)
        self.works = []
        for i in range(n_works):
            kind, creator_pid, pub_pid = WORK_KINDS[i % 3]
            self.works.append(self._add("work", i, self._work_title(), "MISC", kind=kind))
        self._assign_facts(creator_pids={w[0]: (w[1], w[2]) for w in WORK_KINDS})
        self._assign_phrase_facts()

    # ------------------------------------------------------------------------------------------ names
    def _word(self, syllables: int) -> str:
        rng = self.rng
        s = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)
        return s.capitalize()

    def _given(self, gender: str) -> str:
        return self._word(self.rng.choice([1, 2])) + ("a" if gender == "f" and self.rng.random() < .6 else "")

    def _org_name(self, kind: str) -> str:
        w = self._word(2)
        return {"university": f"University of {w}", "company": f"{w} {self.rng.choice(['Corporation', 'Industries', 'Group'])}",
                "label": f"{w} Records", "publisher": f"{w} Press", "party": f"{w} {self.rng.choice(['Party', 'League'])}",
                "club": f"{w} {self.rng.choice(['Society', 'Club', 'Guild'])}"}[kind]

    def _work_title(self) -> str:
        return self.rng.choice(["", "The "]) + self._word(2) + " " + self._word(self.rng.choice([1, 2]))

    def _add(self, prefix: str, i: int, name: str, typ: str, **kw) -> Ent:
        while name in self._names or name in self._taken:  # unique in this world, unused by excluded ones
            name = name + self.rng.choice(["o", "an", "el"])
        self._names.add(name)
        e = Ent(f"{prefix}{i}", name, typ, **kw)
        self.ents[e.key] = e
        return e

    def year(self, y: int) -> str:
        key = f"year{y}"
        if key not in self.ents:
            self.ents[key] = Ent(key, str(y), "TIME")
        return key

    def date(self, y: int, rng: random.Random) -> str:
        name = f"{rng.randint(1, 28)} {rng.choice(MONTHS)} {y}"
        key = f"date:{name}"
        if key not in self.ents:
            self.ents[key] = Ent(key, name, "TIME")
        return key

    # ------------------------------------------------------------------------------------------ facts
    def _assign_facts(self, creator_pids) -> None:
        rng = self.rng
        unis, comps = self.orgs_by_kind["university"], self.orgs_by_kind["company"]
        for p_i, p in enumerate(self.persons):
            f, j = divmod(p_i, 4)
            by = p.facts.pop("birth_year")
            birth_city = rng.choice(self.cities)
            p.facts.update(P569=self.date(by, rng), P19=birth_city.key, P27=birth_city.facts["P17"],
                           P69=rng.choice(unis).key, P108=rng.choice(comps).key)
            if by < 1945:
                p.facts.update(P570=self.date(by + rng.randint(55, 90), rng), P20=rng.choice(self.cities).key)
            if j in (0, 1):
                p.facts["P26"] = self.persons[4 * f + 1 - j].key
                p.facts["P40"] = [self.persons[4 * f + 2].key, self.persons[4 * f + 3].key]
            else:
                p.facts.update(P22=self.persons[4 * f].key, P25=self.persons[4 * f + 1].key,
                               P3373=self.persons[4 * f + 5 - j].key)
            if rng.random() < .3:
                p.facts["P166"] = rng.choice(self.awards).key
            if rng.random() < .4:
                p.facts["P102"] = rng.choice(self.orgs_by_kind["party"]).key
            if rng.random() < .3:
                p.facts["P463"] = rng.choice(self.orgs_by_kind["club"]).key
        for kind, orgs in self.orgs_by_kind.items():
            for o in orgs:
                city = rng.choice(self.cities)
                o.facts.update(P159=city.key, P17=city.facts["P17"], P571=self.year(rng.randint(1800, 1990)),
                               P112=rng.choice(self.persons).key, P488=rng.choice(self.persons).key)
                if kind in ("label", "publisher") and rng.random() < .5:
                    o.facts["P749"] = rng.choice(comps).key
        for w in self.works:
            creator_pid, pub_pid = creator_pids[w.kind]
            creator = rng.choice(self.persons)
            pub_kind = "label" if pub_pid == "P264" else "publisher"
            country = self.ents[creator.facts["P27"]]
            w.facts.update({creator_pid: creator.key, pub_pid: rng.choice(self.orgs_by_kind[pub_kind]).key,
                            "P577": self.year(rng.randint(1920, 2020)), "P495": country.key,
                            "P364": country.facts["P37"]})
            creator.facts.setdefault("P800", []).append(w.key)

    def _pool(self, name: str) -> list[Ent]:
        return {"person": self.persons, "city": self.cities, "country": self.countries,
                "company": self.orgs_by_kind["company"], "club": self.orgs_by_kind["club"],
                "novel": [w for w in self.works if w.kind == "novel"]}[name]

    def _assign_phrase_facts(self) -> None:
        """Facts of `self.phrases` (`PHRASE_RELATIONS`), from a random stream of their own: a world without
        phrases is the world it was before they existed."""
        rng = random.Random(f"memllm-phrases:{self.seed}")
        for phrase in self.phrases:
            subjects, objects = (self._pool(p) for p in PHRASE_RELATIONS[phrase])
            for subj in subjects:
                if rng.random() < PHRASE_SHARE:
                    obj = rng.choice(objects)
                    if obj is not subj:
                        subj.facts[phrase_id(phrase)] = obj.key

    def names(self) -> frozenset[str]:
        """Every named entity's name (dates and years excluded)."""
        return frozenset(e.name for e in self.ents.values() if e.type != "TIME")

    def reverse(self, pid: str) -> dict[str, list[str]]:
        """object key -> subject keys for `pid` (cached)."""
        cache = self.__dict__.setdefault("_reverse", {})
        if pid not in cache:
            rev: dict[str, list[str]] = {}
            for e in list(self.ents.values()):
                for v in self.values(e, pid):
                    rev.setdefault(v, []).append(e.key)
            cache[pid] = rev
        return cache[pid]

    def values(self, ent: Ent, pid: str) -> list[str]:
        v = ent.facts.get(pid)
        return [] if v is None else (list(v) if isinstance(v, list) else [v])
