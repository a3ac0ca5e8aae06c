"""`TripleMemory`: the paper's triple memory (§3.1) with batched queries, edits, provenance and files.

Query definition (object query <s, r, *>; subject queries mirror it):
    C = {e : cos(e, e_q) >= tau_e},  T = {t : cos(t, t_q) >= tau_t}
    results = {x : (e, t, x) stored, e in C, t in T, (cos(e, e_q) + cos(t, t_q)) / 2 >= tau_r}
An entity reached through several triples keeps its best score; results are ordered by score desc, then
entity id; more than q_thr results -> `too_large` (entities empty). A whole batch of queries is answered with
one entity range search and one vectorised join that scores each joined triple's relation exactly (so the
relation side needs no index search and loses nothing to approximate search).

Names are stripped of surrounding whitespace; each unique name is embedded once (stored names reuse their
table embedding; query-only names sit in a bounded cache). One lock serialises readers and the writer, so
reads from several threads see either all or none of a concurrent `add`.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import pathlib
import threading
from typing import Iterable, Sequence

import numpy as np

from memllm_jax.config import MemoryConfig
from memllm_jax.errors import InputError
from memllm_jax.memory.index import exact_cos, make_index
from memllm_jax.memory.tables import NameTable, TripleTable
from memllm_jax.protocol import Query, Triple


@dataclasses.dataclass
class QueryResult:
    entities: list[str]
    scores: list[float]
    too_large: bool = False
    ids: list[int] = dataclasses.field(default_factory=list)
    n_matched: int = 0
    """Number of matching entities before the q_thr cut."""


class MemoryInputError(InputError):
    """Bad names or embeddings; raised before anything is written."""


def _clean(name, where: str, max_chars: int) -> str:
    if not isinstance(name, str):
        raise MemoryInputError(f"{where}: expected a string, got {type(name).__name__}")
    out = name.strip()
    if not out:
        raise MemoryInputError(f"{where}: empty or whitespace-only name {name!r}")
    if len(out) > max_chars:
        raise MemoryInputError(f"{where}: name has {len(out)} characters, the limit is {max_chars} "
                               f"(MemoryConfig.max_name_chars): {out[:40]!r}...")
    return out


def _clean_triples(triples: Sequence[Triple], max_chars: int) -> tuple[list[str], list[str], list[str]]:
    """Cleaned (subjects, relations, objects). Each distinct raw name is checked once; if any is bad, the
    per-triple pass raises naming the first bad triple and field."""
    subj = [t.subject for t in triples]
    rel = [t.relation for t in triples]
    obj = [t.object for t in triples]
    try:
        raw = dict.fromkeys(itertools.chain(subj, rel, obj))
    except TypeError:  # an unhashable name
        raw = None
    if raw is not None:
        ok = {}
        for name in raw:
            out = name.strip() if isinstance(name, str) else ""
            if not out or len(out) > max_chars:
                break
            ok[name] = out
        else:
            return [ok[n] for n in subj], [ok[n] for n in rel], [ok[n] for n in obj]
    for k, t in enumerate(triples):
        for field in ("subject", "relation", "object"):
            _clean(getattr(t, field), f"triple {k}: {field}", max_chars)
    raise AssertionError("unreachable: a bad name was found above")  # pragma: no cover


class TripleMemory:
    def __init__(self, encoder, config: MemoryConfig | None = None):
        self.encoder = encoder
        self.config = config or MemoryConfig()
        c = self.config
        kwargs = dict(partition_threshold=c.partition_threshold, delta_min=c.index_delta_min,
                      leaves_to_search_fraction=c.scann_leaves_to_search_fraction)
        self.entities = NameTable(make_index(c.index, encoder.dim, **kwargs))
        self.relations = NameTable(make_index(c.index, encoder.dim, **kwargs))
        self.triples = TripleTable()
        self._cache: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------------------ embeddings

    def _embed(self, names: Sequence[str], table: NameTable | None = None) -> np.ndarray:
        """Embeddings of names: from the table if stored, else the cache, else the encoder (once each)."""
        out = np.zeros((len(names), self.encoder.dim), np.float32)
        missing: dict[str, list[int]] = {}
        tables = ([table] if table is not None else []) + [self.entities, self.relations]
        for i, name in enumerate(names):
            owner = next((t for t in tables if name in t.ids), None)
            if owner is not None:  # same encoder, same name: the stored embedding
                out[i] = owner.vector(owner.ids[name])
            elif name in self._cache:
                out[i] = self._cache[name]
                self._cache.move_to_end(name)
            else:
                missing.setdefault(name, []).append(i)
        if missing:
            uniq = list(missing)
            vecs = np.asarray(self.encoder.encode(uniq), np.float32)
            if vecs.shape != (len(uniq), self.encoder.dim):
                raise MemoryInputError(f"encoder {self.encoder.name}: returned shape {vecs.shape}, "
                                       f"expected {(len(uniq), self.encoder.dim)}")
            bad = ~np.isfinite(vecs).all(axis=1)
            if bad.any():
                raise MemoryInputError(f"encoder {self.encoder.name}: non-finite embedding for name "
                                       f"{uniq[int(np.argmax(bad))]!r}")
            norms = np.linalg.norm(vecs, axis=1)
            if (np.abs(norms - 1) > 1e-3).any():
                raise MemoryInputError(f"encoder {self.encoder.name}: embedding of "
                                       f"{uniq[int(np.argmax(np.abs(norms - 1)))]!r} is not unit-norm")
            for name, vec in zip(uniq, vecs):
                for i in missing[name]:
                    out[i] = vec
                self._cache[name] = vec
            while len(self._cache) > self.config.cache_size:
                self._cache.popitem(last=False)
        return out

    # ---------------------------------------------------------------------------------------- writes

    def add(self, triples: Sequence[Triple], source: str | Sequence[str] = "", replace: bool = False,
            seqs: Sequence[int] | None = None) -> list[int]:
        """Insert triples (dedup: an existing triple keeps its id and provenance); returns their ids.

        replace=True: a new triple whose subject and relation exactly match stored triples replaces them
        (their objects are deleted), as in knowledge editing (paper §4.3). `source` is the provenance of
        every triple (a document / sentence id, "import"), or one source per triple; `seqs` optionally sets
        the insertion-order numbers (import keeps those of the export).
        """
        subj, rel, obj = _clean_triples(triples, self.config.max_name_chars)
        if seqs is not None and len(seqs) != len(subj):
            raise MemoryInputError(f"add: {len(seqs)} seqs for {len(subj)} triples")
        sources = None if isinstance(source, str) else list(source)
        if sources is not None and len(sources) != len(subj):
            raise MemoryInputError(f"add: {len(sources)} sources for {len(subj)} triples")
        with self._lock:
            # embed everything new first: an encoder error leaves the memory untouched
            ent_ids, rel_ids = self.entities.ids, self.relations.ids
            new_e = [n for n in dict.fromkeys(itertools.chain.from_iterable(zip(subj, obj))) if n not in ent_ids]
            new_r = [n for n in dict.fromkeys(rel) if n not in rel_ids]
            e_vecs, r_vecs = self._embed(new_e, self.entities), self._embed(new_r, self.relations)
            if new_e:
                self.entities.add(new_e, e_vecs)
            if new_r:
                self.relations.add(new_r, r_vecs)
            s = np.fromiter(map(ent_ids.__getitem__, subj), np.int64, len(subj))
            r = np.fromiter(map(rel_ids.__getitem__, rel), np.int64, len(rel))
            o = np.fromiter(map(ent_ids.__getitem__, obj), np.int64, len(obj))
            keys = list(zip(s.tolist(), r.tolist(), o.tolist()))
            if replace and keys:
                pos, rows = self.triples.lookup("s", s)
                same_sr = rows[self.triples.col("r")[rows] == r[pos]]
                batch = set(keys)
                col = self.triples.col
                stale = [t for t in set(same_sr.tolist()) if (col("s")[t], col("r")[t], col("o")[t]) not in batch]
                self.triples.remove(stale)
            stored = self.triples.keys
            first = dict(zip(reversed(keys), range(len(keys) - 1, -1, -1)))  # key -> first position in the batch
            new_k = sorted(k for key, k in first.items() if key not in stored)
            if new_k:
                nk = np.array(new_k, np.int64)
                src = (np.full(len(nk), self.triples.source_id(source), np.int64) if sources is None
                       else np.array([self.triples.source_id(sources[k]) for k in new_k], np.int64))
                seq = (np.asarray(seqs, np.int64)[nk] if seqs is not None
                       else self.triples.next_seq + np.arange(len(nk)))
                self.triples.append(s[nk], r[nk], o[nk], seq, src)
            # an existing triple keeps its id (and provenance); repeats within the batch share the first's id
            return list(map(stored.__getitem__, keys))

    def delete_triples(self, triples: Iterable[Triple]) -> int:
        """Delete stored triples (exact names); returns how many were deleted."""
        with self._lock:
            rows = set()
            for t in triples:
                key = (self.entities.ids.get(t.subject.strip()), self.relations.ids.get(t.relation.strip()),
                       self.entities.ids.get(t.object.strip()))
                if key in self.triples.keys:
                    rows.add(self.triples.keys[key])
            self.triples.remove(sorted(rows))
            return len(rows)

    def delete_entity(self, name: str) -> int:
        """Delete an entity and every triple it takes part in; returns the number of triples deleted."""
        with self._lock:
            row = self.entities.ids.get(name.strip())
            if row is None:
                return 0
            rows = np.concatenate([self.triples.lookup(c, [row])[1] for c in ("s", "o")])
            rows = np.unique(rows)
            self.triples.remove(rows)
            self.entities.remove(row)
            return len(rows)

    def delete_relation(self, name: str) -> int:
        with self._lock:
            row = self.relations.ids.get(name.strip())
            if row is None:
                return 0
            rows = self.triples.lookup("r", [row])[1]
            self.triples.remove(rows)
            self.relations.remove(row)
            return len(rows)

    # ----------------------------------------------------------------------------------------- reads

    def query(self, queries: Sequence[Query], config: MemoryConfig | None = None) -> list[QueryResult]:
        """Answer a batch of object / subject queries (see the module docstring)."""
        c = config or self.config
        mc = self.config.max_name_chars
        ents, rels = [], []
        for k, q in enumerate(queries):
            if (q.subject is None) == (q.object is None):
                raise MemoryInputError(f"query {k}: exactly one of subject and object must be given")
            ents.append(_clean(q.given_entity, f"query {k}: entity", mc))
            rels.append(_clean(q.relation, f"query {k}: relation", mc))
        results: list[QueryResult] = [QueryResult([], []) for _ in queries]
        if not queries:
            return results
        with self._lock:
            eq_QxE = self._embed(ents, self.entities)
            rq_QxE = self._embed(rels, self.relations)
            eq, erow, esim = self.entities.index.range_search(eq_QxE, c.tau_entity)
            is_obj = np.array([q.is_object_query for q in queries])
            rel_vecs, rel_alive = self.relations.index.rows.vectors, self.relations.index.rows.alive
            # join: for each (query, candidate entity) the triples with that entity at the given end; the
            # relation side is scored exactly on the joined triples (a candidate has few triples), so no
            # relation index search: T's test cos(t, t_q) >= tau_t is applied to each joined triple
            qs, xs, scores = [], [], []
            for given, other, mask in (("s", "o", is_obj), ("o", "s", ~is_obj)):
                sel = mask[eq]
                pos, trow = self.triples.lookup(given, erow[sel])
                q_of = eq[sel][pos]
                rel = self.triples.col("r")[trow]
                # each (query, relation) pair's cosine once: hub entities repeat relations
                n_rel = max(len(rel_vecs), 1)
                pair_keys, inverse = np.unique(q_of * n_rel + rel, return_inverse=True)
                pair_q, pair_r = pair_keys // n_rel, pair_keys % n_rel
                t_score = exact_cos(rq_QxE[pair_q], rel_vecs[pair_r])[inverse]
                score = 0.5 * (esim[sel][pos] + t_score)
                ok = (t_score >= c.tau_relation) & rel_alive[rel] & (score >= c.tau_result)
                qs.append(q_of[ok])
                xs.append(self.triples.col(other)[trow[ok]])
                scores.append(score[ok])
            qs, xs, scores = np.concatenate(qs), np.concatenate(xs), np.concatenate(scores)
            if c.exact_match_priority:
                self._exact_override(queries, ents, rels, results, c)
            # best score per (query, entity), then order by query, score desc, entity id
            order = np.lexsort((xs, -scores, qs))
            qs, xs, scores = qs[order], xs[order], scores[order]
            first = np.ones(len(qs), bool)
            if len(qs):
                seen = np.unique(qs * (self.entities.index.rows.n + 1) + xs, return_index=True)[1]
                first[:] = False
                first[seen] = True
            qs, xs, scores = qs[first], xs[first], scores[first]
            order = np.lexsort((xs, -scores, qs))
            qs, xs, scores = qs[order], xs[order], scores[order]
            bounds = np.searchsorted(qs, np.arange(len(queries) + 1))
            for k in range(len(queries)):
                if results[k].n_matched:  # answered by exact-match priority
                    continue
                lo, hi = bounds[k], bounds[k + 1]
                res = results[k]
                res.n_matched = int(hi - lo)
                if hi - lo > c.q_thr:
                    res.too_large = True
                    continue
                res.ids = xs[lo:hi].tolist()
                res.entities = [self.entities.names[i] for i in res.ids]
                res.scores = scores[lo:hi].tolist()
        return results

    def _exact_override(self, queries, ents, rels, results, c: MemoryConfig) -> None:
        for k, q in enumerate(queries):
            e, r = self.entities.ids.get(ents[k]), self.relations.ids.get(rels[k])
            if e is None or r is None:
                continue
            given, other = ("s", "o") if q.is_object_query else ("o", "s")
            _, rows = self.triples.lookup(given, [e])
            rows = rows[self.triples.col("r")[rows] == r]
            if len(rows):
                ids = sorted(set(self.triples.col(other)[rows].tolist()))
                res = results[k]
                res.n_matched = len(ids)
                if len(ids) > c.q_thr:
                    res.too_large = True
                else:
                    res.ids, res.scores = ids, [1.0] * len(ids)
                    res.entities = [self.entities.names[i] for i in ids]

    def match(self, subject: str | None = None, relation: str | None = None, object: str | None = None,
              config: MemoryConfig | None = None) -> list[tuple[Triple, float]]:
        """RET-LLM query forms: any one or two slots given; whole triples back, exact names first.

        If every given name is stored and some triple matches them exactly, those triples (score 1.0) are
        returned; otherwise the fuzzy form: each given slot's candidates by tau_e / tau_t, triples whose
        given slots are all candidates, scored by the mean cosine of the given slots, kept if >= tau_r.
        Ordered by score desc, then triple id.
        """
        c = config or self.config
        mc = self.config.max_name_chars
        slots = {k: _clean(v, f"match: {k}", mc) for k, v in (("s", subject), ("r", relation), ("o", object))
                 if v is not None}
        if not 1 <= len(slots) <= 2:
            raise MemoryInputError("match: give one or two of subject, relation, object")
        with self._lock:
            tables = {"s": self.entities, "r": self.relations, "o": self.entities}
            exact = {k: tables[k].ids.get(v) for k, v in slots.items()}
            if all(v is not None for v in exact.values()):
                first = next(iter(exact))
                _, rows = self.triples.lookup(first, [exact[first]])
                for k, v in exact.items():
                    rows = rows[self.triples.col(k)[rows] == v]
                if len(rows):
                    return [(self._triple(t), 1.0) for t in sorted(rows.tolist())]
            sims: dict[str, dict[int, float]] = {}
            for k, name in slots.items():
                table, tau = tables[k], (c.tau_relation if k == "r" else c.tau_entity)
                _, rows, s = table.index.range_search(self._embed([name], table), tau)
                sims[k] = dict(zip(rows.tolist(), s.tolist()))
            first = min(sims, key=lambda k: len(sims[k]))
            _, rows = self.triples.lookup(first, list(sims[first]))
            out = []
            for t in rows.tolist():
                vals = [sims[k].get(int(self.triples.col(k)[t])) for k in slots]
                if all(v is not None for v in vals) and sum(vals) / len(vals) >= c.tau_result:
                    out.append((-(sum(vals) / len(vals)), t))
            return [(self._triple(t), -neg) for neg, t in sorted(out)]

    def exact_view(self) -> "TripleMemory":
        """A read-only view answering queries by exact brute force over the same tables (the reference)."""
        from memllm_jax.memory.index import ExactIndex

        view = object.__new__(TripleMemory)
        view.__dict__.update(self.__dict__)
        view.config = dataclasses.replace(self.config, index="exact")
        for attr in ("entities", "relations"):
            table = getattr(self, attr)
            exact = ExactIndex(self.encoder.dim)
            exact.rows = table.index.rows
            copy = NameTable(exact)
            copy.names, copy.ids = table.names, table.ids
            setattr(view, attr, copy)
        return view

    def _triple(self, row: int) -> Triple:
        col = self.triples.col
        return Triple(self.entities.names[col("s")[row]], self.relations.names[col("r")[row]],
                      self.entities.names[col("o")[row]])

    def triple_rows(self) -> np.ndarray:
        """Alive triple rows in insertion order (seq)."""
        rows = np.nonzero(self.triples.alive())[0]
        return rows[np.argsort(self.triples.col("seq")[rows], kind="stable")]

    def records(self) -> list[dict]:
        """Every stored triple with provenance, in insertion order (the export format)."""
        with self._lock:
            col = self.triples.col
            return [{**dataclasses.asdict(self._triple(t)), "source": self.triples.sources[col("src")[t]],
                     "seq": int(col("seq")[t])} for t in self.triple_rows().tolist()]

    def show(self, entity: str) -> list[Triple]:
        """Triples in which `entity` is the subject or the object."""
        with self._lock:
            row = self.entities.ids.get(entity.strip())
            if row is None:
                return []
            rows = np.unique(np.concatenate([self.triples.lookup(c, [row])[1] for c in ("s", "o")]))
            return [self._triple(t) for t in rows.tolist()]

    def stats(self) -> dict:
        with self._lock:
            n_e, n_r, n_t = len(self.entities), len(self.relations), len(self.triples)
            emb_bytes = (self.entities.index.rows.n + self.relations.index.rows.n) * self.encoder.dim * 4
            triple_bytes = self.triples.n * 8 * len(TripleTable.COLS)
            return {"entities": n_e, "relations": n_r, "triples": n_t,
                    "records_per_triple": (n_e + n_r) / n_t if n_t else 0.0,
                    "embedding_bytes": emb_bytes, "triple_bytes": triple_bytes,
                    "bytes_per_triple": (emb_bytes + triple_bytes) / n_t if n_t else 0.0,
                    "encoder": self.encoder.name, "dim": self.encoder.dim, "index": self.config.index}

    # ----------------------------------------------------------------------------------------- files

    def save(self, directory) -> pathlib.Path:
        from memllm_jax.memory import files

        with self._lock:
            return files.save(self, pathlib.Path(directory))

    @classmethod
    def open(cls, directory, encoder, config: MemoryConfig | None = None) -> "TripleMemory":
        from memllm_jax.memory import files

        return files.load(cls, pathlib.Path(directory), encoder, config)

    def export_jsonl(self, path) -> int:
        from memllm_jax.files import atomic_write_text

        recs = self.records()
        atomic_write_text(pathlib.Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
        return len(recs)

    def import_jsonl(self, path, replace: bool = False) -> int:
        """Add the triples of a JSONL file (`subject`, `relation`, `object`, optional `source`, `seq`).

        Every line is validated first; a bad line raises naming the file, line and field, and nothing is added.
        """
        from memllm_jax.memory.files import read_triples_jsonl

        triples, sources, seqs = read_triples_jsonl(pathlib.Path(path), self.config.max_name_chars)
        keep_seqs = seqs is not None and self.triples.n == 0  # an export's order, into an empty memory
        self.add(triples, source=sources, replace=replace, seqs=seqs if keep_seqs else None)
        return len(triples)
