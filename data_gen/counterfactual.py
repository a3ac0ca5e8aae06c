"""Counterfactual variants of a DocRED-format corpus (paper §4.1, after Modarressi et al. 2024).

In variant v every entity is replaced, in all its full mentions across the whole corpus, by another entity
of the same DocRED type drawn from elsewhere in the corpus; relations are kept, so the documents now state
facts that contradict what a pretrained model knows. The replacement is a per-type permutation of the
corpus's entity names (a shuffled cycle, so no name maps to itself and two entities never merge).
Pronoun mentions are kept as they are.
"""

from __future__ import annotations

import random
from typing import Iterable, Mapping

from data_gen.docred import PRONOUNS


def _canonical(entity: list[dict]) -> str | None:
    full = [m for m in entity if " ".join(str(m.get("name", "")).split()).lower() not in PRONOUNS]
    return full[0]["name"] if full else None


def name_pools(docs: Iterable[Mapping]) -> dict[str, list[str]]:
    """type -> sorted distinct canonical entity names of the corpus."""
    pools: dict[str, set[str]] = {}
    for d in docs:
        for ent in d["vertexSet"]:
            name = _canonical(ent)
            if name:
                pools.setdefault(str(ent[0].get("type", "")), set()).add(name)
    return {t: sorted(names) for t, names in pools.items()}


def permutation(pools: Mapping[str, list[str]], seed: int, variant: int) -> dict[tuple[str, str], str]:
    """(type, name) -> replacement name for one variant."""
    mapping: dict[tuple[str, str], str] = {}
    for typ, names in sorted(pools.items()):
        if len(names) < 2:
            continue
        order = list(names)
        random.Random(f"memllm-cf:{seed}:{variant}:{typ}").shuffle(order)
        for i, name in enumerate(order):
            mapping[(typ, name)] = order[(i + 1) % len(order)]
    return mapping


def replace_entities(doc: Mapping, mapping: Mapping[tuple[str, str], str]) -> dict:
    """One document with its entities' full mentions replaced; token positions are recomputed."""
    sents = [list(s) for s in doc["sents"]]
    vertex = [[dict(m) for m in ent] for ent in doc["vertexSet"]]
    per_sent: dict[int, list[tuple[int, int, str, int, int]]] = {}
    for e_i, ent in enumerate(vertex):
        name = _canonical(ent)
        new = mapping.get((str(ent[0].get("type", "")), name)) if name else None
        if new is None:
            continue
        for m_i, m in enumerate(ent):
            if " ".join(str(m.get("name", "")).split()).lower() in PRONOUNS:
                continue
            per_sent.setdefault(m["sent_id"], []).append((m["pos"][0], m["pos"][1], new, e_i, m_i))
    for sid, reps in per_sent.items():
        reps.sort(key=lambda r: (r[0], -(r[1] - r[0])))
        kept, end = [], -1
        for r in reps:  # outermost mention wins where mentions overlap
            if r[0] >= end:
                kept.append(r)
                end = r[1]
        old = sents[sid]
        new_tokens: list[str] = []
        new_index = [0] * (len(old) + 1)
        spans: dict[tuple[int, int], tuple[int, int]] = {}
        i = 0
        k = 0
        while i < len(old):
            if k < len(kept) and kept[k][0] == i:
                s, e, name, _, _ = kept[k]
                start = len(new_tokens)
                new_tokens.extend(name.split())
                for j in range(s, e):
                    new_index[j] = start
                spans[(s, e)] = (start, len(new_tokens))
                i, k = e, k + 1
                continue
            new_index[i] = len(new_tokens)
            new_tokens.append(old[i])
            i += 1
        new_index[len(old)] = len(new_tokens)
        sents[sid] = new_tokens
        for e_i, ent in enumerate(vertex):
            for m in ent:
                if m["sent_id"] != sid:
                    continue
                s, e = m["pos"]
                covering = next(((a, b) for (a, b) in spans if a <= s and e <= b), None)
                if covering is not None:
                    m["pos"] = list(spans[covering])
                else:
                    m["pos"] = [new_index[s], new_index[e] if e < len(old) else len(new_tokens)]
                    m["pos"][1] = max(m["pos"][1], m["pos"][0] + 1)
        for s, e, name, e_i, m_i in reps:
            vertex[e_i][m_i]["name"] = name
    out = dict(doc)
    out.update(sents=sents, vertexSet=vertex, title=f"{doc.get('title', '')}")
    return out
