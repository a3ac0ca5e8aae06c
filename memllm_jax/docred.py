"""The pieces of the DocRED format the library reads itself (`memllm memory write` takes DocRED corpora and
relation-label files): detokenization of token lists with character offsets, and the P-id -> label file.
The rest of the format (documents, entities, relations) is data_gen/docred.py's.
"""

from __future__ import annotations

import os
import pathlib

from memllm_jax.errors import InputError, load_json

DEFAULT_REL_INFO = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "docred" / "rel_info.json"

_NO_SPACE_BEFORE = frozenset(". , ; : ! ? ) ] } % 's 'S n't 're 've 'll 'd 'm ’s ’ ” …".split())
_NO_SPACE_AFTER = frozenset("( [ { $ “ ‘".split())

def detokenize(sents: list[list[str]]) -> tuple[str, list[tuple[int, int]], list[list[tuple[int, int]]]]:
    """Join tokens into readable text; returns (text, sentence spans, token spans)."""
    parts: list[str] = []
    length = 0
    sent_spans: list[tuple[int, int]] = []
    tok_spans: list[list[tuple[int, int]]] = []
    open_quote = False
    prev = None
    for sent in sents:
        spans = []
        sent_start = None
        for tok in sent:
            if tok == '"':
                space = prev is not None and (not open_quote) and prev not in _NO_SPACE_AFTER
                open_quote = not open_quote
            else:
                space = prev is not None and tok not in _NO_SPACE_BEFORE and prev not in _NO_SPACE_AFTER
                if prev == '"' and open_quote:
                    space = False
            if space:
                parts.append(" ")
                length += 1
            spans.append((length, length + len(tok)))
            if sent_start is None:
                sent_start = length
            parts.append(tok)
            length += len(tok)
            prev = tok
        sent_spans.append((sent_start if sent_start is not None else length, length))
        tok_spans.append(spans)
    return "".join(parts), sent_spans, tok_spans


def load_relation_labels(path: str | os.PathLike | None = None) -> dict[str, str]:
    """P-id -> label from a JSON object file (`rel_info.json` or `rel_labels_memllm.json`)."""
    path = pathlib.Path(path) if path is not None else DEFAULT_REL_INFO
    if not path.is_file():
        raise InputError(f"{path}: relation label file not found")
    labels = load_json(path)
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise InputError(f"{path}: expected a JSON object mapping relation ids (e.g. 'P17') to label strings")
    return labels
