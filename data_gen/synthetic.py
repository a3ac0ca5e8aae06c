"""The synthetic corpus (the embedded default's whole world), written in DocRED format.

Documents are about a focus entity (person, organisation, work, city or country) of `synth_world.World`
and state a random subset of its facts with several templates per relation, in random order: the first
sentence names the focus, later ones often refer to it with a pronoun ("He", "Her", "It", "Its"), and
pronoun mentions are annotated in `vertexSet` as DocRED does. Follow-up sentences state facts of the
entities the document introduced (the employer's founder, the birthplace's country), so facts spread
across sentences, and because the world is shared, facts written to memory from one document help predict
another. Style "retllm" gives RET-LLM-like documents: several people with the same relation to one
organisation. Generation is seeded, deterministic and streamed.
"""

from __future__ import annotations

import random
import re
from typing import Iterable, Iterator

from data_gen.synth_world import INVERSE, PHRASE_RELATIONS, RELATIONS, TRAIN_PHRASES, World, phrase_id
from memllm_jax.protocol import Triple

# {S}: the focus (name or pronoun), {S's}: its possessive, {P19}: the focus's value for P19,
# {P19.P17}: the P17 value of that value (a fact about another entity), {C}: the work's creator.
TEMPLATES: dict[str, list[str]] = {
    "PER": [
        "{S} was born in {P19} .", "{S} was born on {P569} in {P19} , {P19.P17} .", "{S} was born on {P569} .",
        "{S} died in {P20} on {P570} .", "{S} died on {P570} .", "{S} spent {S's} last years in {P20} , where {S} died .",
        "{S} was a citizen of {P27} .", "{S} held the citizenship of {P27} .",
        "{S} studied at the {P69} .", "{S} graduated from the {P69} , which was founded in {P69.P571} .",
        "{S} was educated at the {P69} in {P69.P159} .",
        "{S} worked for {P108} .", "{S} joined {P108} , a company founded by {P108.P112} .",
        "{S} was employed by {P108} , headquartered in {P108.P159} .",
        "{S} married {P26} .", "{S's} spouse was {P26} .",
        "{S's} father was {P22} .", "{S} was the child of {P22} and {P25} .", "{S's} mother was {P25} .",
        "{S's} sibling is {P3373} .", "{S} grew up with {P3373} , a sibling born in {P3373.P19} .",
        "{S} is the parent of {P40} .", "{S's} child {P40} was born in {P40.P19} .",
        "{S} received {P166} .", "{S} was awarded {P166} .",
        "{S} was a member of the {P102} .", "{S} joined the {P102} .", "{S} belonged to the {P463} .",
        "{S} is known for {P800} .", "{S's} best known work is {P800} , released in {P800.P577} .",
    ],
    "ORG": [
        "{S} is an organisation based in {P159} .", "{S} was founded in {P571} by {P112} .",
        "{S} was founded by {P112} .", "{S} was established in {P571} .",
        "{S's} headquarters are in {P159} , {P159.P17} .", "{S's} chairperson is {P488} .",
        "{S} is chaired by {P488} , who was born in {P488.P19} .", "{S} is a subsidiary of {P749} .",
        "{S} operates in {P17} .",
    ],
    "WORK": [
        "{S} is a {kind} by {C} , released in {P577} .", "{S} was created by {C} .", "{S} came out in {P577} .",
        "{S} was released by {P264} .", "{S} was published by {P123} .", "{S} is in {P364} .",
        "{S} was produced in {P495} .", "{S} was released on the {P264} label , founded in {P264.P571} .",
    ],
    "CITY": [
        "{S} is a city in {P131} , {P17} .", "{S} lies in {P17} .", "{S} is the capital of {P1376} .",
        "{S} is located in {P131} , a region of {P131.P17} .",
    ],
    "COUNTRY": [
        "{S} is a country in {P30} .", "{S's} capital is {P36} .", "The official language of {S} is {P37} .",
        "{S} contains {P150} .", "{S's} capital {P36} lies in {P36.P131} .",
    ],
}
FOLLOW_UPS: list[str] = [
    "{X} was founded in {X.P571} .", "{X} was founded by {X.P112} .", "{X} is based in {X.P159} .",
    "{X} lies in {X.P17} .", "{X} is the capital of {X.P1376} .", "{X} was born in {X.P19} .",
    "{X} was released in {X.P577} .",
]
FILLERS: list[str] = [
    "{S} was widely discussed at the time .", "Little else is recorded about {S} .", "Opinions about {S} differ .",
    "The details are given in several later accounts .", "{S's} story is told in many ways .",
]
"""Sentences without relations, so write examples also teach the empty call."""
PHRASE_FORMS: tuple[str, ...] = ("{S's} {phrase} was {O} .", "The {phrase} of {S} was {O} .", "{O} was {S's} {phrase} .")
"""How a phrase relation's fact is stated (`synth_world.PHRASE_RELATIONS`): the phrase itself, in one of these forms."""
OCCUPATIONS = "writer musician politician engineer scientist painter lawyer architect".split()
PRONOUNS = {"m": ("He", "His"), "f": ("She", "Her"), "n": ("It", "Its")}
_SLOT = re.compile(r"\{([^}]+)\}")


class _DocBuilder:
    def __init__(self, world: World, focus) -> None:
        self.w, self.focus = world, focus
        self.sents: list[list[str]] = []
        self.mentions: dict[str, list[dict]] = {}
        self.labels: dict[tuple[str, str, str], set[int]] = {}

    def _emit(self, tokens: list[str], key: str, text: str, typ: str) -> None:
        words = text.split()
        self.mentions.setdefault(key, []).append(
            {"name": text, "sent_id": len(self.sents), "pos": [len(tokens), len(tokens) + len(words)], "type": typ})
        tokens.extend(words)

    def _fact(self, h: str, pid: str, t: str) -> None:
        sid = len(self.sents)
        self.labels.setdefault((h, t, pid), set()).add(sid)
        if pid in INVERSE:
            self.labels.setdefault((t, h, INVERSE[pid]), set()).add(sid)

    def _resolve(self, ref: str, rng: random.Random, chosen: dict[str, str]) -> str | None:
        """Entity key for a slot like 'P19', 'P19.P17', 'X.P571', 'C'; None when the fact does not exist."""
        if ref in chosen:
            return chosen[ref]
        head, _, tail = ref.rpartition(".")
        subj = (self.focus.key if not head else self._resolve(head, rng, chosen))
        if subj is None:
            return None
        if tail == "C":
            vals = [self.w.ents[subj].facts[p] for p in ("P175", "P50", "P57") if p in self.w.ents[subj].facts]
        else:
            vals = self.w.values(self.w.ents[subj], tail)
        if not vals:
            return None
        chosen[ref] = rng.choice(vals)
        pid = tail if tail != "C" else next(p for p in ("P175", "P50", "P57") if p in self.w.ents[subj].facts)
        chosen["fact:" + ref] = (subj, pid)
        return chosen[ref]

    def sentence(self, template: str, rng: random.Random, pronoun_ok: bool, x_key: str | None = None) -> bool:
        chosen: dict = {"X": x_key} if x_key else {}
        slots = _SLOT.findall(template)
        for s in slots:
            if s not in ("S", "S's", "kind") and self._resolve(s, rng, chosen) is None:
                return False
        facts = [(*chosen["fact:" + s], chosen[s]) for s in slots if "fact:" + s in chosen and s != "X"]
        if facts and all((h, t, pid) in self.labels for h, pid, t in facts):
            return False  # says nothing new
        tokens: list[str] = []
        focus, use_pron = self.focus, pronoun_ok and rng.random() < 0.6
        for piece in template.split():
            m = _SLOT.fullmatch(piece)
            if not m:
                tokens.append(piece)
                continue
            s = m.group(1)
            if s in ("S", "S's"):
                if use_pron:
                    word = PRONOUNS[focus.gender][s == "S's"]
                    self._emit(tokens, focus.key, word if not tokens else word.lower(), focus.type)
                    use_pron = rng.random() < 0.5 or s == "S"  # later references in the sentence vary
                else:
                    self._emit(tokens, focus.key, focus.name, focus.type)
                    if s == "S's":
                        tokens.append("'s")
            elif s == "kind":
                tokens.append(focus.kind)
            else:
                key = chosen[s]
                ent = self.w.ents[key]
                words_before = len(tokens)
                self._emit(tokens, key, ent.name, ent.type)
                if words_before == 0 and tokens[0] in ("the",):
                    tokens[0] = "The"
        for h, pid, t in facts:
            self._fact(h, pid, t)
        self.sents.append(tokens)
        return True

    def document(self, title: str) -> dict:
        order = list(self.mentions)
        vertex = [self.mentions[k] for k in order]
        idx = {k: i for i, k in enumerate(order)}
        labels = [{"h": idx[h], "t": idx[t], "r": pid, "evidence": sorted(ev)}
                  for (h, t, pid), ev in self.labels.items() if h in idx and t in idx and h != t]
        return {"title": title, "sents": self.sents, "vertexSet": vertex, "labels": labels}


def _focus_kind(ent) -> str:
    if ent.type == "PER":
        return "PER"
    if ent.type == "ORG":
        return "ORG"
    if ent.key.startswith("work"):
        return "WORK"
    return "COUNTRY" if ent.key.startswith("country") else "CITY"


def phrase_template(form: str, phrase: str) -> str:
    """A `PHRASE_FORMS` form as a document template for `phrase` (its object slot named by the relation id)."""
    return form.replace("{phrase}", phrase).replace("{O}", "{" + phrase_id(phrase) + "}")


def _phrase_templates(world: World, focus, rng: random.Random) -> list[str]:
    """One sentence form per phrase relation of `world` whose subject pool `focus` belongs to."""
    pool = {"PER": "person", "CITY": "city", "COUNTRY": "country"}.get(_focus_kind(focus))
    pool = pool or ("company" if focus.kind == "company" else "novel" if focus.kind == "novel" else None)
    return [phrase_template(rng.choice(PHRASE_FORMS), p) for p in world.phrases if PHRASE_RELATIONS[p][0] == pool]


def _zipf_pick(items: list, rng: random.Random):
    return items[int(len(items) * rng.random() ** 1.6)]


def generate_document(world: World, index: int, style: str = "docred") -> dict:
    rng = random.Random(f"memllm-doc:{world.seed}:{style}:{index}")
    if style == "retllm":
        return _retllm_document(world, rng, index)
    r = rng.random()
    pool = (world.persons if r < .55 else [o for os in world.orgs_by_kind.values() for o in os] if r < .7
            else world.works if r < .85 else world.cities if r < .95 else world.countries)
    focus = _zipf_pick(pool, rng)
    kind = _focus_kind(focus)
    b = _DocBuilder(world, focus)
    if kind == "PER":
        job = rng.choice(OCCUPATIONS)
        job = ("an " if job[0] in "aeiou" else "a ") + job
        if "P570" in focus.facts:
            b.sentence("{S} ( {P569} – {P570} ) was " + job + " from {P27} .", rng, False)
        else:
            b.sentence("{S} ( born {P569} ) is " + job + " from {P27} .", rng, False)
    else:
        for t in rng.sample(TEMPLATES[kind], len(TEMPLATES[kind])):
            if b.sentence(t, rng, False):
                break
    phrased = _phrase_templates(world, focus, rng) if world.phrases else []
    templates = rng.sample(TEMPLATES[kind] + phrased, len(TEMPLATES[kind]) + len(phrased))
    want = rng.randint(3, 7)
    for t in templates:
        if len(b.sents) > want:
            break
        b.sentence(t, rng, t not in phrased)  # a phrase relation's subject is named: the sentence alone states it
        if rng.random() < .12:
            b.sentence(rng.choice(FILLERS), rng, True)
        if rng.random() < .3:
            others = [k for k, ms in b.mentions.items() if k != focus.key and world.ents[k].type in ("ORG", "LOC", "PER", "MISC")]
            if others:
                x = rng.choice(others)
                for f in rng.sample(FOLLOW_UPS, len(FOLLOW_UPS)):
                    if b.sentence(f, rng, False, x_key=x):
                        break
    return b.document(focus.name)


_RETLLM = {"P108": ("company", "{X} work for {O} .", "{X} is employed by {O} ."),
           "P102": ("party", "{X} are members of the {O} .", "{X} is a member of the {O} ."),
           "P463": ("club", "{X} belong to the {O} .", "{X} belongs to the {O} .")}


def _retllm_document(world: World, rng: random.Random, index: int) -> dict:
    pid = rng.choice(sorted(_RETLLM))
    kind, plural, single = _RETLLM[pid]
    org = rng.choice(world.orgs_by_kind[kind])
    members = [p for p in world.reverse(pid).get(org.key, [])]
    b = _DocBuilder(world, org)
    rng.shuffle(members)
    for _ in range(rng.randint(1, 3)):
        k = rng.randint(1, 3)
        group, members = members[:k], members[k:]
        if not group:
            break
        tokens: list[str] = []
        for i, p in enumerate(group):
            if i:
                tokens.append("and" if i == len(group) - 1 else ",")
            b._emit(tokens, p, world.ents[p].name, "PER")
            b._fact(p, pid, org.key)
        tmpl = (plural if len(group) > 1 else single).split()
        for piece in tmpl[1:]:
            if piece == "{O}":
                b._emit(tokens, org.key, org.name, "ORG")
            else:
                tokens.append(piece)
        b.sents.append(tokens)
    if not b.sents:
        b.sentence("{S} was founded by {P112} .", rng, False)
    else:
        b.sentence(rng.choice(["{S} was founded by {P112} .", "{S's} chairperson is {P488} ."]), rng, False)
    return b.document(org.name)


def iter_synthetic(n_docs: int, seed: int = 0, n_persons: int | None = None, style: str = "docred",
                   world: World | None = None, phrases: tuple[str, ...] = ()) -> Iterator[dict]:
    """Stream `n_docs` DocRED-format documents. The world has `n_persons` people (default n_docs // 2,
    clamped to [40, 50000]), so entities recur across documents, and the facts of the phrase relations `phrases`."""
    if world is None:
        world = World(seed, n_persons if n_persons is not None else min(50000, max(40, n_docs // 2)), phrases=phrases)
    for i in range(n_docs):
        yield generate_document(world, i, style)


HELDOUT_SEED_SUFFIX = ":heldout"


def heldout_split(n_train: int, n_heldout: int, seed: int = 0, style: str = "docred",
                  phrases: bool = False) -> tuple[list[dict], list[dict]]:
    """Training documents from one world and held-out documents from a second world that shares no entity
    name with the first (seeded `f"{seed}:heldout"`), so no held-out fact is stated in training text: only a
    memory can supply it. Returns (training documents, held-out documents). `phrases`: the training world states
    `TRAIN_PHRASES`' facts, the held-out world every phrase relation's (`HELDOUT_PHRASES` held out by relation)."""
    train_world = World(seed, min(50000, max(40, n_train // 2)), phrases=TRAIN_PHRASES if phrases else ())
    heldout_world = World(f"{seed}{HELDOUT_SEED_SUFFIX}", max(40, n_heldout // 2), exclude_names=train_world.names(),
                          phrases=tuple(PHRASE_RELATIONS) if phrases else ())
    return (list(iter_synthetic(n_train, style=style, world=train_world)),
            list(iter_synthetic(n_heldout, style=style, world=heldout_world)))


EDITS_SEED_SUFFIX = ":edits"


def edit_world(n_docs: int, seed: int = 0, exclude_names: Iterable[str] = (), phrases: bool = False) -> World:
    """The third world (seeded `f"{seed}:edits"`, sharing no entity name with `exclude_names`, the corpus's names)
    whose facts the Table 3 analogue edits: as in ZsRE, the edits are about subjects that neither the training text
    nor the evaluation documents mention, and there are enough of them for one edit per subject and kind of answer
    (`data_gen.edits.synthetic_edits`). `phrases`: it has every phrase relation's facts too
    (`synth_world.PHRASE_RELATIONS`)."""
    return World(f"{seed}{EDITS_SEED_SUFFIX}", max(40, n_docs // 2), exclude_names=frozenset(exclude_names),
                 phrases=tuple(PHRASE_RELATIONS) if phrases else ())


def phrase_triples(world: World, phrases: Iterable[str]) -> list[Triple]:
    """The facts of `world` whose relation is one of `phrases` (`synth_world.PHRASE_RELATIONS`), as named triples."""
    pids = {phrase_id(p): p for p in phrases}
    return sorted(Triple(e.name, pids[pid], world.ents[obj].name) for e in world.ents.values()
                  for pid, obj in e.facts.items() if pid in pids)


def synthetic_rel_info(phrases: bool = False) -> dict[str, str]:
    """The synthetic corpus's relation labels: DocRED's, and with `phrases` the phrase relations' (id -> phrase)."""
    return dict(RELATIONS) | ({phrase_id(p): p for p in PHRASE_RELATIONS} if phrases else {})


def cloze_templates() -> dict[str, list[str]]:
    """Relation label -> sentence templates of the corpus whose first slot after the subject is that relation's
    object, written with `{S}` / `{S's}` for the subject and `{O}` for the object (for editing prompts: the
    text before `{O}` is a cloze, the whole sentence with a new `{O}` is an edit statement)."""
    out: dict[str, list[str]] = {}
    for templates in TEMPLATES.values():
        for template in templates:
            slots = _SLOT.findall(template)
            if len(slots) < 2 or slots[0] not in ("S", "S's") or not re.fullmatch(r"P\d+", slots[1]):
                continue
            if not template.startswith("{" + slots[0] + "}"):
                continue
            if "{" in template[len(slots[0]) + 2 : template.index("{" + slots[1] + "}")]:
                continue  # another slot before the object
            text = template[: template.index("{" + slots[1] + "}")] + "{O}."
            label = RELATIONS[slots[1]]
            if text not in out.setdefault(label, []):
                out[label].append(text)
    return out


def phrase_cloze_forms(phrase: str) -> list[str]:
    """`PHRASE_FORMS` for `phrase` as `cloze_templates` writes them (`{O}` and the full stop), the cloze forms
    (subject before the object) first: "{S's} mentor was {O}.", "The mentor of {S} was {O}.", "{O} was {S's}
    mentor."."""
    return [f.replace("{phrase}", phrase).replace(" .", ".") for f in PHRASE_FORMS]


def fill_cloze(template: str, subject: str, obj: str | None = None) -> str:
    """The template with the subject filled in; with `obj=None`, the text before `{O}` (the cloze prompt)."""
    text = template.replace("{S's}", subject + "'s").replace("{S}", subject)
    if obj is None:
        return text[: text.index("{O}")]
    return text.replace("{O}", obj)
