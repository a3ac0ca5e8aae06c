"""How much of the evaluation corpus the training corpus already states (the held-out world's check).

Table 2 measures facts a model cannot know without memory only when the evaluation facts are absent from the
training text. `heldout_overlap` reports the fraction of evaluation gold triples that are also gold triples of
some training document, and the fraction of TARGET mentions (the entities the gold reads predict) whose name
occurs anywhere in the training text, with and without dates and years (which any two worlds share).
"""

from __future__ import annotations

import re
from typing import Sequence

from data_gen.docred import Document
from data_gen.gold_memory import gold_triples

_DATE = re.compile(r"^(\d{1,2} \w+ )?\d{3,4}$")


def _occurs(name: str, text: str) -> bool:
    """`name` appears in `text` as whole words (not inside a longer word)."""
    return re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", text) is not None


def heldout_overlap(train: Sequence[Document], evaluation: Sequence[Document], target_names: Sequence[str]) -> dict:
    train_triples = {t for d in train for t in gold_triples(d)}
    eval_triples = [t for d in evaluation for t in gold_triples(d)]
    text = "\n".join(d.text for d in train)
    cache: dict[str, bool] = {}
    hits = [cache.setdefault(n, _occurs(n, text)) for n in target_names]
    named = [h for n, h in zip(target_names, hits) if not _DATE.match(n)]
    return {
        "eval_triples": len(eval_triples),
        "triples_in_train": sum(t in train_triples for t in eval_triples) / max(1, len(eval_triples)),
        "target_mentions": len(hits),
        "targets_in_train": sum(hits) / max(1, len(hits)),
        "named_target_mentions": len(named),
        "named_targets_in_train": sum(named) / max(1, len(named)),
    }
