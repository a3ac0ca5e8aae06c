"""Distant-supervision filter (paper §4.1.1, Appendix E): an LLM judges, per candidate relation, whether the
focus ("main") sentence gives evidence for it, with the 8-shot reasoning prompt of Figure 5.

Candidates come from DocRED-format documents: for relation (h, r, t) and sentence i where one entity has a
mention in sentence i and the other in sentences <= i, the context is sentences < i and the main sentence
is sentence i (text as space-joined DocRED tokens, like the prompt's shots). The gold answer is whether i
is annotated as evidence. `generate_fn(list[prompt]) -> list[completion]` is any text generator;
`parse_answer` reads "The answer is Yes/No" (never raises). Scoring follows Table 1's protocol: a balanced
set of positives (the main sentence is evidence) and negatives (it holds an entity but is not evidence),
with precision / recall / F1 / accuracy of the Yes class.
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Callable, Iterable, Iterator, Mapping, Sequence

from data_gen.docred import PRONOUNS

GenerateFn = Callable[[Sequence[str]], Sequence[str]]

FIGURE5_SHOTS = """To determine whether the main sentence contains information about the given relation, both the main sentence and the context will be provided. The goal is to identify whether there is evidence of the relation in the main sentence, supported by the context. If there is no relation or the evidence exists solely in the context without requiring the main sentence, respond with No. Otherwise, respond with Yes. Provide reasoning to support your response.

Context:

Main Sentence: James Michael Osting ( born April 7 , 1977 ) is a former Major League Baseball pitcher .

Relation: ("Osting", "date of birth", "April 7 , 1977")

Evidence: The relation indicates that Osting was born on April 7, 1977. The main sentence explicitly mentions that Osting was born on April 7, 1977. The answer is Yes.

Context: Splashdown is a Hot Tuna album released in 1984 containing the tracks from a previously unreleased live acoustic performance that had been played on the short - lived radio station WQIV in the mid-1970s . During the recording , news of the Apollo - Soyuz mission returning to Earth after the first USA - USSR rendezvous in space reached the station , and the astronauts ' radio transmissions were played at the same time as Jorma and Jack continued with " Police Dog Blues . " The transmissions mixed with the song were preserved for this release as the last track of side 1 .

Main Sentence: The album was Hot Tuna 's first release on Relix Records , and one of the first Relix releases .

Relation: ("Hot Tuna", "country of origin", "USA")

Evidence: The relation indicates that the origin of Hot Tuna is the country of the United States. There is no evidence in the main sentence regarding the country of origin of Hot Tuna. The answer is No.

Context:

Main Sentence: The Chemung Canal Bank Building is located at 415 East Water Street in Elmira , Chemung County , New York , United States .

Relation: ("Chemung County", "capital", "Elmira")

Evidence: The relation indicates that Elmira is the capital of Chemung County. The main sentence only specifies the location of Elmira within Chemung County but does not mention Elmira as the capital of Chemung County. The answer is No.

Context: Carrie Lam Cheng Yuet - ngor , GBM , GBS ( ; born 13 May 1957 ) is the 4th and current Chief Executive of Hong Kong . Before that she was the Chief Secretary for Administration , the most senior rank of principal officials of Hong Kong , from 2012 to 2017 .

Main Sentence: After graduating from the University of Hong Kong , Lam joined the civil service in 1980 and served in various bureaux and departments .

Relation: ("Lam", "educated at", "University of Hong Kong")

Evidence: The relation indicates that Lam received education at the University of Hong Kong. The main sentence mentions that Carrie Lam Cheng Yuet-ngor graduated from the University of Hong Kong. The answer is Yes.

Context: Pacific Fair is a major shopping centre in Broadbeach Waters on the Gold Coast , Queensland , Australia . It was Queensland 's largest regional shopping centre until 2006 . Pacific Fair was developed by Hooker Retail Developments and opened in 1977 on what was swampland with 96 specialty stores and two anchor tenants . Since then , Pacific Fair has undergone numerous expansions and has grown to have more than 300 specialty stores and four anchor tenants . In January 2014 , work began on a major redevelopment project to meet the predicted regional growth on the Gold Coast . Prior to the redevelopment , the shopping centre had four main major stores including a four - level Myer , Kmart , Target , Coles and Toys ' R ' Us . Daimaru operated in the centre before its Australian withdrawal , albeit briefly .

Main Sentence: It also had a 12-screen Birch Carroll and Coyle Cinema ( re - opened as Event Cinemas in late 2015 ) .

Relation: ("Event Cinemas", "country", "Australia")

Evidence: The relation indicates that Event Cinemas is located in the country of Australia. The main sentence mentions that Event Cinemas is part of Pacific Fair which is located in Australia. The answer is Yes.

Context: Benjamin Winslow Harris ( November 10 , 1823 - February 7 , 1907 ) was a nineteenth - century politician , lawyer and judge from Massachusetts . He was the father of Robert Orr Harris . Born in East Bridgewater , Massachusetts , Harris pursued an academic course at Phillips Academy , Andover , graduating in 1847 . He graduated from Dane Law School of Harvard University in 1849 . He was admitted to the bar in Boston , Massachusetts in 1850 , commencing practice in East Bridgewater . He served in the Massachusetts Senate in 1857 , was a member of the Massachusetts House of Representatives in 1858 , was district attorney for the southeastern district of Massachusetts from 1858 to 1866 and was collector of internal revenue for the second district of Massachusetts from 1866 to 1873 . Harris was elected a Republican to the United States House of Representatives in 1872 , serving from 1873 to 1883 , not being a candidate for renomination in 1882 . There , he served as chairman of the Committee on Naval Affairs from 1881 to 1883 . Afterwards , he resumed practicing law in East Bridgewater , Massachusetts and was judge of probate for Plymouth County , Massachusetts from 1887 to 1906 .

Main Sentence: Harris died in East Bridgewater on February 7 , 1907 and was interred in Central Cemetery in East Bridgewater .

Relation: ("Benjamin Winslow Harris", "place of birth", "East Bridgewater")

Evidence: The relation indicates that Benjamin Winslow Harris was born in East Bridgewater. The main sentence lacks information about Benjamin Winslow Harris's place of birth. The evidence for East Bridgewater as his birthplace is exclusively found in the context, not in the main sentence. The answer is No.

Context: Greatest Hats is the first compilation album by the Canadian new wave / synthpop group Men Without Hats , released in 1996 .

Main Sentence: A slightly modified version of the album was released in the US in 1996 , entitled Collection .

Relation: ("Collection", "performer", "Men Without Hats")

Evidence: The relation indicates that Men Without Hats is the performer of the Collection album. The main sentence says that Men Without Hats released slightly modified version of the Greatest Hats album which is the album Collection. The answer is Yes.

Context: Aaron Hobart ( June 26 , 1787 - September 19 , 1858 ) was a U.S. Representative from Massachusetts . Born in Abington , Massachusetts , Hobart pursued classical studies and graduated from Brown University in 1805 . He studied law , was admitted to the bar and commenced practice in Abington . He served as member of the Massachusetts House of Representatives and served in the Massachusetts State Senate . Hobart was elected as a Democratic - Republican to the Sixteenth Congress to fill the vacancy caused by the resignation of Zabdiel Sampson . He was reelected as a Democratic - Republican to the Seventeenth Congress , elected as an Adams - Clay Republican to the Eighteenth Congress , and reelected as an Adams candidate to the Nineteenth Congress , and served from November 24 , 1820 , to March 3 , 1827 . He declined to be a candidate for renomination in 1826 .

Main Sentence: He then served as an Executive councilor 1827 - 1831 and served as probate judge 1843 - 1858 .

Relation: ("Aaron Hobart", "date of death", "1858")

Evidence: The relation indicates that Aaron Hobart passed away in the year 1858. The main sentence does not contain information about the given relation. The evidence of Aaron Hobart's date of death in 1858 is solely present in the context and is not mentioned in the provided main sentence. The answer is No."""
"""Figure 5 of the paper: the instruction and the eight worked examples, verbatim."""

QUERY_TEMPLATE = """Context: {context}

Main Sentence: {focus}

Relation: ("{e1}", "{relation}", "{e2}")

Evidence:"""


@dataclasses.dataclass(frozen=True)
class Candidate:
    doc: int
    relation: int
    """Index into the document's labels."""
    sent_id: int
    context: str
    focus: str
    head: str
    label: str
    tail: str
    gold: bool | None
    """True when `sent_id` is annotated as evidence (None when the relation has no evidence annotation)."""


def build_prompt(context: str, focus: str, head: str, label: str, tail: str) -> str:
    query = QUERY_TEMPLATE.format(context=context, focus=focus, e1=head, relation=label, e2=tail)
    return FIGURE5_SHOTS + "\n\n" + query.replace("Context: \n", "Context:\n")


def parse_answer(completion: str) -> bool | None:
    """True for Yes, False for No, None when the completion gives no answer."""
    try:
        text = completion.split("Context:")[0]  # a model continuing with a new shot stops counting here
        m = re.findall(r"answer is\W*(yes|no)\b", text, flags=re.IGNORECASE)
        if m:
            return m[-1].lower() == "yes"
        words = re.findall(r"\b(yes|no)\b", text, flags=re.IGNORECASE)
        return words[-1].lower() == "yes" if words else None
    except Exception:  # noqa: BLE001 - model output is untrusted
        return None


def _name(here: list[str], before: list[str], everywhere: list[str]) -> str:
    """The name the relation shows: a full (non-pronoun) mention from the main sentence, else the context, else
    anywhere in the document; a pronoun only when the entity has no full mention at all."""
    for names in (here, before[::-1], everywhere):
        full = [n for n in names if " ".join(n.split()).lower() not in PRONOUNS]
        if full:
            return full[0]
    return (here or before)[0]


def candidates(doc: Mapping, doc_index: int, labels: Mapping[str, str]) -> list[Candidate]:
    sents = [" ".join(s) for s in doc["sents"]]
    mentions = [[(m["sent_id"], m["name"]) for m in ent] for ent in doc["vertexSet"]]
    out = []
    for r_i, lab in enumerate(doc.get("labels", [])):
        h, t = mentions[lab["h"]], mentions[lab["t"]]
        evidence = set(lab.get("evidence", []))
        for i in range(len(sents)):
            h_here = [n for s, n in h if s == i]
            t_here = [n for s, n in t if s == i]
            if not (h_here or t_here):
                continue
            h_before = [n for s, n in h if s < i]
            t_before = [n for s, n in t if s < i]
            if not ((h_here or h_before) and (t_here or t_before)):
                continue
            head = _name(h_here, h_before, [n for _, n in h])
            tail = _name(t_here, t_before, [n for _, n in t])
            out.append(Candidate(doc_index, r_i, i, " ".join(sents[:i]), sents[i], head, labels[lab["r"]],
                                 tail, (i in evidence) if evidence else None))
    return out


def balanced_test_set(docs: Iterable[Mapping], labels: Mapping[str, str], n_per_class: int, seed: int = 0) -> list[Candidate]:
    """Table 1's protocol: n positives (main sentence is evidence) and n negatives, sampled with `seed`."""
    pos, neg = [], []
    for d_i, d in enumerate(docs):
        for c in candidates(d, d_i, labels):
            if c.gold is True:
                pos.append(c)
            elif c.gold is False:
                neg.append(c)
    rng = random.Random(seed)
    rng.shuffle(pos)
    rng.shuffle(neg)
    out = pos[:n_per_class] + neg[:n_per_class]
    rng.shuffle(out)
    return out


def complete(cands: Sequence[Candidate], generate_fn: GenerateFn, batch_size: int = 8) -> list[str]:
    """The model's completion of each candidate's Figure 5 prompt, `batch_size` prompts per call."""
    out: list[str] = []
    for i in range(0, len(cands), batch_size):
        batch = cands[i:i + batch_size]
        completions = list(generate_fn([build_prompt(c.context, c.focus, c.head, c.label, c.tail) for c in batch]))
        if len(completions) != len(batch):
            raise ValueError(f"generate_fn returned {len(completions)} completions for {len(batch)} prompts")
        out.extend(completions)
    return out


def judge(cands: Sequence[Candidate], generate_fn: GenerateFn, batch_size: int = 8) -> list[bool | None]:
    return [parse_answer(c) for c in complete(cands, generate_fn, batch_size)]


def decision(answer: bool | None) -> str:
    """"yes", "no", or "unparsed" (the completion gave no answer; it counts as No)."""
    return "unparsed" if answer is None else ("yes" if answer else "no")


def score(predictions: Sequence[bool | None], golds: Sequence[bool]) -> dict[str, float]:
    """Precision / recall / F1 / accuracy of the Yes class; an unparsable answer counts as No."""
    tp = sum(1 for p, g in zip(predictions, golds) if p is True and g)
    fp = sum(1 for p, g in zip(predictions, golds) if p is True and not g)
    fn = sum(1 for p, g in zip(predictions, golds) if p is not True and g)
    tn = sum(1 for p, g in zip(predictions, golds) if p is not True and not g)
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    acc = (tp + tn) / len(golds) if golds else 0.0
    return {"precision": prec, "recall": rec, "f1": f1, "accuracy": acc, "n": len(golds),
            "unparsed": sum(p is None for p in predictions)}


def to_judge(docs: Sequence[Mapping], labels: Mapping[str, str],
             only_missing_evidence: bool = False) -> list[Candidate]:
    """Every candidate sentence of every relation of `docs`; with `only_missing_evidence`, only those of the
    relations without annotated evidence (Re-DocRED: the annotated ones are kept untouched)."""
    return [c for i, d in enumerate(docs) for c in candidates(d, i, labels)
            if not (only_missing_evidence and d["labels"][c.relation].get("evidence"))]


def relabel(docs: Sequence[Mapping], cands: Sequence[Candidate], answers: Sequence[bool | None]) -> Iterator[dict]:
    """`docs` with every judged relation kept when the model found evidence in at least one of its candidate
    sentences (which become its evidence) and dropped otherwise; relations not judged are kept as they are."""
    yes: dict[tuple[int, int], list[int]] = {}
    for c, a in zip(cands, answers):
        if a:
            yes.setdefault((c.doc, c.relation), []).append(c.sent_id)
    judged = {(c.doc, c.relation) for c in cands}
    for i, d in enumerate(docs):
        new = [lab if (i, r_i) not in judged else {**lab, "evidence": sorted(set(yes[(i, r_i)]))}
               for r_i, lab in enumerate(d.get("labels", [])) if (i, r_i) not in judged or (i, r_i) in yes]
        yield {**d, "labels": new}


def filter_documents(docs: Sequence[Mapping], labels: Mapping[str, str], generate_fn: GenerateFn,
                     only_missing_evidence: bool = False, batch_size: int = 8) -> list[dict]:
    """`relabel(docs)` by the model's answers (`generate_fn`) for the candidates `to_judge`."""
    cands = to_judge(docs, labels, only_missing_evidence)
    return list(relabel(docs, cands, judge(cands, generate_fn, batch_size)))
