"""Tokenizers with the memory-API markers as single special ids.

Two kinds: a byte-level BPE we train with HF `tokenizers` for the embedded default (`train_tokenizer`,
saved as `tokenizer.json`), and any Hugging Face tokenizer directory loaded with `transformers` (e.g. a
user's Mistral tokenizer), to which the markers are added as special tokens when missing. Both expose the
same small API (`Tokenizer`). Special tokens are matched on raw text before any splitting, so every
marker in a protocol-formatted string becomes its id; document text is escaped by `protocol.escape_text`
first and therefore never contains a marker string. Training also checks that no learned BPE token spells
a marker, so no other path leads to a marker id.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Iterable, Sequence

import numpy as np

from memllm_jax import protocol
from memllm_jax.errors import InputError
from memllm_jax.files import atomic_write_text
from memllm_jax.model.gguf import resolve_model_dir

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"


class Tokenizer:
    """`encode` / `decode` / `marker_id` / `bos_id` / `eos_id` / `pad_id` / `vocab_size`."""

    def __init__(self, backend, *, bos_id: int, eos_id: int, pad_id: int, path: str = "", hf=None):
        self._tok = backend  # a tokenizers.Tokenizer
        self._hf = hf
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.path = path
        self.marker_id: dict[str, int] = {}
        for m in protocol.MARKERS:
            i = backend.token_to_id(m)
            if i is None:
                raise InputError(f"{path}: tokenizer has no special token for marker {m!r}")
            self.marker_id[m] = i
        self._skip = {bos_id, eos_id, pad_id}
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of protocol-formatted text (no BOS/EOS added)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`: markers come back as their strings, BOS/EOS/PAD are dropped, escapes are kept."""
        ids = [int(i) for i in ids if int(i) not in self._skip]
        return self._tok.decode(ids, skip_special_tokens=False)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    @property
    def marker_ids(self) -> frozenset[int]:
        return frozenset(self.marker_id.values())

    def save(self, out_dir: str | os.PathLike) -> pathlib.Path:
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self._hf is not None:
            self._hf.save_pretrained(str(out))
        else:
            atomic_write_text(out / "tokenizer.json", self._tok.to_str())
            atomic_write_text(out / "memllm_tokenizer.json", json.dumps({"bos": BOS, "eos": EOS, "pad": PAD, "unk": UNK}))
        return out


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token-id sequences."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n




def _check_no_marker_spelled(backend, path: str) -> None:
    """No ordinary (non-special) vocabulary entry may decode to text containing a marker."""
    special = {backend.token_to_id(m) for m in protocol.MARKERS}
    decoder = backend.decoder
    for tok, i in backend.get_vocab(with_added_tokens=False).items():
        if i in special:
            continue
        surface = decoder.decode([tok]) if decoder is not None else tok
        if any(m in surface for m in protocol.MARKERS):
            raise InputError(f"{path}: vocabulary token {i} ({surface!r}) spells a memory-API marker")


def _between_markers(texts: Iterable[str]) -> Iterable[str]:
    """The text between marker strings: markers encode as their own special tokens, so training text that
    contains API calls must not let BPE merge across a marker's edge (e.g. `>>` + `)-->`)."""
    marker_re = re.compile("|".join(re.escape(m) for m in sorted(protocol.MARKERS, key=len, reverse=True)))
    for text in texts:
        yield from (piece for piece in marker_re.split(text) if piece)


NAME_SPACE = r" (?=[\p{Lu}\p{N}])"
"""A space before a capitalised word or a number. With `name_spaces`, it is a token of its own, so a name
(or a date) is spelled with the same tokens in running text (" Kerek Group") and in an API field
(`>>Kerek Group`, where no space precedes it): the memory models then copy names token for token instead of
learning, for every name, that " Kerek" and "Kerek" are the same word. It costs ~10% more tokens."""


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike | None = None,
                    min_frequency: int = 2, name_spaces: bool = True) -> Tokenizer:
    """Train a byte-level BPE on `texts` (escape document text first) and save it to `out_dir`."""
    from tokenizers import AddedToken, Regex, Tokenizer as HFTok, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    specials = [PAD, BOS, EOS, UNK, *protocol.MARKERS]
    if vocab_size < len(specials) + 256:
        raise ValueError(f"vocab_size {vocab_size} is too small: byte-level BPE needs at least {len(specials) + 256}")
    tok = HFTok(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if name_spaces:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(NAME_SPACE), behavior="isolated"),
                                                     tok.pre_tokenizer])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_between_markers(texts), trainer=trainer)
    _check_no_marker_spelled(tok, str(out_dir or "<trained tokenizer>"))
    result = Tokenizer(tok, bos_id=tok.token_to_id(BOS), eos_id=tok.token_to_id(EOS), pad_id=tok.token_to_id(PAD),
                       path=str(out_dir or ""))
    if out_dir is not None:
        result.save(out_dir)
    return result


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Our trained BPE (a `tokenizer.json` file or its directory), a Hugging Face tokenizer directory, or a
    `.gguf` model file."""
    from tokenizers import Tokenizer as HFTok  # noqa: PLC0415

    p = pathlib.Path(path)
    if str(p).lower().endswith(".gguf"):  # a llama.cpp file: its tokenizer, converted once (model.gguf)
        p = resolve_model_dir(p)
    ours = p / "memllm_tokenizer.json" if p.is_dir() else p.parent / "memllm_tokenizer.json"
    if ours.exists():
        tj = p / "tokenizer.json" if p.is_dir() else p
        tok = HFTok.from_file(str(tj))
        return Tokenizer(tok, bos_id=tok.token_to_id(BOS), eos_id=tok.token_to_id(EOS), pad_id=tok.token_to_id(PAD), path=str(p))
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: not a tokenizer directory or a trained tokenizer.json")
    from transformers import AutoTokenizer  # noqa: PLC0415

    hf = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    # Every marker must be a special (added) token, matched before BPE: a base vocabulary may already spell one
    # as an ordinary token (SmolLM2 has "})"), which BPE could otherwise merge with neighbouring characters.
    added = {t.content for t in hf.added_tokens_decoder.values()}
    missing = [m for m in protocol.MARKERS if m not in added]
    if missing:
        hf.add_special_tokens({"additional_special_tokens": missing}, replace_extra_special_tokens=False)
    backend = getattr(hf, "backend_tokenizer", None) or getattr(hf, "_tokenizer", None)
    if backend is None:
        raise InputError(f"{p}: only fast (tokenizer.json-backed) Hugging Face tokenizers are supported")
    if hf.eos_token_id is None:
        raise InputError(f"{p}: tokenizer has no EOS token")
    bos = hf.bos_token_id if hf.bos_token_id is not None else hf.eos_token_id
    pad = hf.pad_token_id if hf.pad_token_id is not None else hf.eos_token_id
    return Tokenizer(backend, bos_id=bos, eos_id=hf.eos_token_id, pad_id=pad, path=str(p), hf=hf)
