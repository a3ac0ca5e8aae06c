"""A memory on disk: a directory of snapshots plus a `CURRENT` pointer.

    DIR/CURRENT                    name of the live snapshot (replaced atomically: the commit point)
    DIR/snap-<time>-<rand>/
        manifest.json              format version, encoder, dim, counts, sha256 of every file
        entities.jsonl             {"id": row, "name": ...} per alive entity
        relations.jsonl            same for relations
        sources.jsonl              one JSON string per line (provenance strings, indexed by triples' src)
        entity_emb/, relation_emb/ zarr arrays (tensorstore) float32 [rows, dim]; deleted rows are zero
        triples/                   zarr int64 [n, 6]: id, subject id, relation id, object id, seq, src

Saving writes a fresh snapshot directory under a temporary name, fsyncs it, renames it into place, and
only then replaces CURRENT; a crash at any point leaves the previous snapshot the live one. Opening checks
the manifest's version, counts and checksums before building anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import secrets
import shutil
import time

import numpy as np

from memllm_jax.errors import InputError, read_text
from memllm_jax.files import atomic_write_text, naming
from memllm_jax.protocol import Triple

FORMAT_VERSION = 1
ARRAYS = ("entity_emb", "relation_emb", "triples")
TABLES = ("entities.jsonl", "relations.jsonl", "sources.jsonl")
MAX_SEQ = 2**62 - 1
"""Largest insertion-order number an import may carry (stored as int64, with room for the ones after it)."""


class MemoryFileError(InputError):
    """A memory directory or JSONL file is damaged or inconsistent."""


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for p in files:
        h.update(str(p.relative_to(path) if path.is_dir() else p.name).encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _write_array(path: pathlib.Path, array: np.ndarray) -> None:
    import tensorstore as ts

    chunk0 = max(1, min(len(array), max(1, (1 << 22) // max(1, array.itemsize * int(np.prod(array.shape[1:]))))))
    store = ts.open({
        "driver": "zarr",
        "kvstore": {"driver": "file", "path": str(path)},
        "metadata": {"dtype": array.dtype.str, "shape": list(array.shape), "chunks": [chunk0, *array.shape[1:]],
                     "compressor": None},
        "create": True, "delete_existing": True,
    }).result()
    store.write(array).result()


def _read_array(path: pathlib.Path, dtype, shape) -> np.ndarray:
    import tensorstore as ts

    if not path.is_dir():
        raise MemoryFileError(f"{path}: array missing")
    try:
        arr = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}, "open": True}).result()
        out = arr.read().result()
    except Exception as exc:  # tensorstore raises ValueError subclasses with long messages
        raise MemoryFileError(f"{path}: cannot read array: {exc}") from exc
    if out.dtype != np.dtype(dtype) or tuple(out.shape) != tuple(shape):
        raise MemoryFileError(f"{path}: expected {np.dtype(dtype)} {tuple(shape)}, found {out.dtype} {out.shape}")
    return out


def _jsonl(records) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def save(mem, directory: pathlib.Path, _before_commit=None) -> pathlib.Path:
    """Write a new snapshot of `mem` and make it current; returns the snapshot path. An OSError while the
    snapshot is written names `directory`, not the temporary snapshot folder."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"snap-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"
    tmp = directory / f".tmp-{name}"
    try:
        _write_snapshot(mem, tmp)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and (exc.filename is None or str(exc.filename).startswith(str(tmp))):
            raise naming(exc, directory) from exc
        raise
    snap = directory / name
    os.rename(tmp, snap)
    _fsync_dir(directory)
    if _before_commit is not None:  # tests inject a crash here
        _before_commit()
    atomic_write_text(directory / "CURRENT", name + "\n")
    _fsync_dir(directory)
    for old in directory.iterdir():
        if old.name != name and (old.name.startswith("snap-") or old.name.startswith(".tmp-snap-")):
            shutil.rmtree(old, ignore_errors=True)
    return snap


def _write_snapshot(mem, tmp: pathlib.Path) -> None:
    """Every file of a snapshot of `mem` into the new folder `tmp`, fsynced."""
    tmp.mkdir()
    ent, rel, tri = mem.entities, mem.relations, mem.triples
    alive = np.nonzero(tri.alive())[0]
    triples = np.stack([alive] + [tri.col(c)[alive] for c in tri.COLS], axis=1).astype(np.int64)
    (tmp / "entities.jsonl").write_text(_jsonl({"id": i, "name": n} for i, n in enumerate(ent.names) if n is not None),
                                        encoding="utf-8")
    (tmp / "relations.jsonl").write_text(_jsonl({"id": i, "name": n} for i, n in enumerate(rel.names) if n is not None),
                                         encoding="utf-8")
    (tmp / "sources.jsonl").write_text(_jsonl(tri.sources), encoding="utf-8")
    _write_array(tmp / "entity_emb", np.ascontiguousarray(ent.index.rows.vectors))
    _write_array(tmp / "relation_emb", np.ascontiguousarray(rel.index.rows.vectors))
    _write_array(tmp / "triples", triples.reshape(-1, 6))
    manifest = {
        "format_version": FORMAT_VERSION,
        "encoder": mem.encoder.name,
        "dim": mem.encoder.dim,
        "counts": {"entity_rows": len(ent.names), "relation_rows": len(rel.names), "entities": len(ent),
                   "relations": len(rel), "triples": int(len(alive)), "sources": len(tri.sources),
                   "next_seq": int(tri.next_seq)},
        "sha256": {f: _sha256(tmp / f) for f in TABLES + ARRAYS},
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    for p in tmp.rglob("*"):
        if p.is_file():
            with open(p, "rb+") as f:
                os.fsync(f.fileno())
    _fsync_dir(tmp)


def _read_jsonl(path: pathlib.Path):
    if not path.exists():
        raise MemoryFileError(f"{path}: file missing")
    out = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise MemoryFileError(f"{path}:{lineno}: invalid JSON: {exc}") from exc
    return out


def current_snapshot(directory: pathlib.Path) -> pathlib.Path:
    pointer = directory / "CURRENT"
    if not pointer.exists():
        raise MemoryFileError(f"{directory}: not a memory directory (no CURRENT file)")
    if pointer.is_dir():
        raise MemoryFileError(f"{pointer}: is a directory, not the memory's snapshot pointer")
    name = read_text(pointer).strip()
    if not name:
        raise MemoryFileError(f"{pointer}: CURRENT is empty (it should name the live snapshot)")
    snap = directory / name
    if "/" in name or name in (".", "..") or not snap.is_dir():
        raise MemoryFileError(f"{pointer}: names a missing snapshot {name!r}")
    return snap


def read_manifest(directory: pathlib.Path) -> dict:
    path = current_snapshot(directory) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        version, counts, sums = manifest["format_version"], manifest["counts"], manifest["sha256"]
        int(manifest["dim"]), str(manifest["encoder"]), int(counts["entity_rows"]), dict(sums)
    except FileNotFoundError as exc:
        raise MemoryFileError(f"{path}: manifest missing") from exc
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise MemoryFileError(f"{path}: damaged manifest ({type(exc).__name__}: {exc})") from exc
    if version != FORMAT_VERSION:
        raise MemoryFileError(f"{path}: format_version {version!r}, this code reads {FORMAT_VERSION}")
    return manifest


def load(cls, directory: pathlib.Path, encoder, config=None):
    """Open the current snapshot: verify, then rebuild tables and indices."""
    snap = current_snapshot(directory)
    manifest = read_manifest(directory)
    mpath = snap / "manifest.json"
    if int(manifest["dim"]) != encoder.dim:
        raise MemoryFileError(f"{mpath}: memory has {manifest['dim']}-d embeddings, encoder {encoder.name} "
                              f"gives {encoder.dim}-d")
    if manifest["encoder"] != encoder.name:
        raise MemoryFileError(f"{mpath}: memory was embedded with encoder {manifest['encoder']!r}, got "
                              f"{encoder.name!r} (export to JSONL and import to move a memory to another encoder)")
    for f in TABLES + ARRAYS:
        if not (snap / f).exists():
            raise MemoryFileError(f"{snap / f}: {'array' if f in ARRAYS else 'file'} missing")
        if _sha256(snap / f) != manifest["sha256"].get(f):
            raise MemoryFileError(f"{snap / f}: checksum does not match {mpath}")
    counts = manifest["counts"]
    dim = encoder.dim
    e_emb = _read_array(snap / "entity_emb", np.float32, (counts["entity_rows"], dim))
    r_emb = _read_array(snap / "relation_emb", np.float32, (counts["relation_rows"], dim))
    tri = _read_array(snap / "triples", np.int64, (counts["triples"], 6))
    for what, arr in (("entity_emb", e_emb), ("relation_emb", r_emb)):
        if not np.isfinite(arr).all():
            raise MemoryFileError(f"{snap / what}: non-finite embedding in row {int(np.argmax(~np.isfinite(arr).all(1)))}")
    mem = cls(encoder, config)
    for fname, table, emb, rows_key in (("entities.jsonl", mem.entities, e_emb, "entity_rows"),
                                        ("relations.jsonl", mem.relations, r_emb, "relation_rows")):
        names: list = [None] * counts[rows_key]
        for k, rec in enumerate(_read_jsonl(snap / fname), 1):
            try:
                names[int(rec["id"])] = str(rec["name"])
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise MemoryFileError(f"{snap / fname}:{k}: bad record ({type(exc).__name__}: {exc})") from exc
        table.add(names, emb)  # rows == ids; dead rows are removed below
        for row, n in enumerate(names):
            if n is None:
                table.names[row] = None
                table.index.remove(np.array([row]))
        table.ids.pop(None, None)
    sources = _read_jsonl(snap / "sources.jsonl")
    for s in sources:
        mem.triples.source_id(str(s))
    if len(tri):
        n_rows = int(tri[:, 0].max()) + 1
        cols = np.zeros((n_rows, 5), np.int64)
        cols[tri[:, 0]] = tri[:, 1:]
        alive = np.zeros(n_rows, bool)
        alive[tri[:, 0]] = True
        mem.triples.append(*(cols[:, j] for j in range(5)), alive=alive)
    mem.triples.next_seq = int(counts.get("next_seq", mem.triples.next_seq))
    if len(mem.triples) != counts["triples"] or len(mem.entities) != counts["entities"]:
        raise MemoryFileError(f"{mpath}: counts do not match the tables")
    return mem


def read_triples_jsonl(path: pathlib.Path, max_chars: int):
    """Validate a triples JSONL file completely; returns (triples, sources, seqs or None)."""
    if not path.exists():
        raise MemoryFileError(f"{path}: file missing")
    triples, sources, seqs = [], [], []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MemoryFileError(f"{where}: invalid JSON: {exc}") from exc
        if not isinstance(rec, dict):
            raise MemoryFileError(f"{where}: expected a JSON object")
        vals = []
        for field in ("subject", "relation", "object"):
            v = rec.get(field)
            if not isinstance(v, str) or not v.strip():
                raise MemoryFileError(f"{where}: field {field!r} must be a non-empty string, got {v!r}")
            if len(v.strip()) > max_chars:
                raise MemoryFileError(f"{where}: field {field!r} longer than {max_chars} characters")
            vals.append(v.strip())
        triples.append(Triple(*vals))
        sources.append(str(rec.get("source", "import")))
        seq = rec.get("seq")
        if isinstance(seq, int) and not isinstance(seq, bool) and not 0 <= seq <= MAX_SEQ:
            raise MemoryFileError(f"{where}: field 'seq' must be in 0..{MAX_SEQ} (an insertion order), got {seq}")
        if seqs is not None:
            if isinstance(seq, int) and not isinstance(seq, bool):
                seqs.append(seq)
            else:
                seqs = None
    return triples, sources, seqs
