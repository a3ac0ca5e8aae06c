"""Shared helpers of the training tests: a small write-style corpus and a BPE trained on it."""

from __future__ import annotations

import json
import pathlib
import random

from memllm_jax import protocol
from memllm_jax.config import TINY

NAMES = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth"]
CITIES = ["London", "Paris", "Berlin", "Rome", "Madrid", "Vienna", "Oslo"]


def write_records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, c = rng.choice(NAMES), rng.choice(CITIES)
        pretext = " ".join(f"{rng.choice(NAMES)} visited {rng.choice(CITIES)} in {1900 + rng.randrange(100)}."
                           for _ in range(rng.randrange(0, 4)))
        sentence = f"{a} was born in {c}."
        call = protocol.format_write_call([protocol.Triple(a, "place of birth", c)])
        out.append({"kind": "write", "doc": f"d{i}", "segments": [
            {"text": protocol.format_write_prompt(pretext, sentence), "loss": False},
            {"text": call, "loss": True}], "eos": True})
    return out


def document_write_records(n_docs: int, seed: int = 0, sentences: int = 5) -> list[dict]:
    """Memory-write examples as the data builder makes them from documents: sentence i's example has the
    document's earlier sentences as its pretext, so one document's examples share a token prefix."""
    rng = random.Random(seed)
    out = []
    for d in range(n_docs):
        facts = [(rng.choice(NAMES), rng.choice(CITIES), 1900 + rng.randrange(100)) for _ in range(sentences)]
        texts = [f"{a} visited {c} in {y}." for a, c, y in facts]
        for i, (a, c, _) in enumerate(facts):
            call = protocol.format_write_call([protocol.Triple(a, "visited", c)])
            out.append({"kind": "write", "doc": f"d{d}", "sent_id": i, "segments": [
                {"text": protocol.format_write_prompt(" ".join(texts[:i]), texts[i]), "loss": False},
                {"text": call, "loss": True}], "eos": True})
    return out


def lm_records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"kind": "lm", "segments": [{"text": " ".join(
        f"{rng.choice(NAMES)} lives in {rng.choice(CITIES)}." for _ in range(rng.randrange(1, 6))), "loss": True}],
        "eos": True} for _ in range(n)]


def write_jsonl(path: pathlib.Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def make_tokenizer(out_dir: pathlib.Path):
    from memllm_jax.tokenizer import train_tokenizer

    texts = [s["text"] for r in write_records(200, 1) + lm_records(200, 1) for s in r["segments"]]
    return train_tokenizer(texts, min(TINY.vocab_size, 400), out_dir)
