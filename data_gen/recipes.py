"""How the training examples are built from a DocRED-format document: `WriteRecipe` for the memory-write
examples, `ReadRecipe` for the memory-read (and evaluation) examples. `data_gen.build.build_all` takes them, and
the pipeline's `DataConfig` holds them, so a new data setting is one field here and the code that reads it."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class WriteRecipe:
    """Memory-write examples: a sentence after its pretext, then its triples as one `({MEM_WRITE-->...})` call."""

    pretext_sentences: int | None = 10
    """Sentences of the document before the focus sentence kept as its context (None: all of them)."""
    context_free: int = 0
    """Extra examples per document: one later sentence with its pretext dropped (`write_examples.
    context_free_items`). Without them the only lone sentences the model sees are documents' first sentences, and it
    writes a biography's opening facts for any lone sentence about a person."""
    lone_phrases: int = 0
    """Extra examples per document: up to this many sentences stating a phrase-relation fact, each with its pretext
    dropped (`write_examples.lone_phrase_items`). Without them the model writes a lone "Y was X's mentor." (an edit)
    in the order of the names, `Y>>mentor>>X`."""
    question_form: int = 0
    """Extra examples per document: one of its triples asked as a question with the answer after
    `protocol.WRITE_BRIDGE` (`write_examples.question_form_items`), the form of Table 3's edits. Not in the
    paper's training data; for a base that otherwise writes the question's subject with an object of its own."""
    evidence: bool = False
    """An example's targets are only the triples its sentence is evidence for (annotated, or for an unannotated
    relation a sentence naming both entities), as the paper builds them; False also gives a triple to every later
    sentence that names one entity with the other in reach."""
    counterfactual: int = 0
    """Counterfactual variants of the documents added to these examples (paper §4.1, `data_gen.counterfactual`):
    every entity renamed, in all its full mentions, as another entity of its type, relations kept, so the model
    must copy names from the text rather than recall them."""

    BOUNDS: ClassVar[dict] = {"pretext_sentences": "nonnegative", "context_free": "nonnegative",
                              "lone_phrases": "nonnegative", "question_form": "nonnegative",
                              "counterfactual": "nonnegative"}


@dataclasses.dataclass(frozen=True)
class ReadRecipe:
    """Memory-read examples (the paper's Algorithm 1): the document with a `({MEM_READ(...)-->` call before each
    entity the memory can supply, the memory's answer, and the text going on."""

    q_thr: int = 30
    """A query whose results hold more entities than this is dropped (paper: 30)."""
    max_queries: int = 3
    """Queries per read call at most."""
    filter_ambiguous: bool = True
    """Drop a read point whose target the queries cannot tell apart from another entity."""
    context_free: int = 0
    """Extra examples per document: the reads of one later sentence with the text before it dropped
    (`read_examples.context_free_records`), so that a read from a lone sentence (a Table 3 cloze) asks the relation
    the sentence states."""
    question_form: int = 0
    """Extra examples per document: one of its triples asked as a question, the read of its subject and relation,
    the memory's answer and the object (`read_examples.question_form_records`). Not in the paper's training data;
    Table 3 forces a read after each question."""
    absent_questions: int = 0
    """Extra examples per document: a question about a fact the memory does not hold, its read, the empty result
    and `protocol.ABSTAIN` as the answer (`read_examples.absent_question_records`). Not in the paper (not
    memory-aware); for a reader whose empty reads are kept in its context (`keep_empty`)."""
    absent_form: str = "question"
    """How the absent-fact examples ask: "question" (a natural question), "cloze" (a sentence start of the
    synthetic corpus's templates, the form of the synthetic Table 3 analogue's prompts; a relation without one is
    asked as a question) or "mixed" (either, at random)."""
    two_hop: int = 0
    """Two-hop questions per document over two of its triples (X r1 C, C r2 Y), each as two examples: the read of X
    and r1, its result, C stated and the next read opened; the question and C with the read of C and r2, its result
    and Y (`data_gen.two_hop.two_hop_records`). Not in the paper (its Limitations: composite relations are not
    used)."""
    two_hop_distractors: float = 0.0
    """Share of the two-hop examples' reads whose results hold, after the right entity, up to two other objects of
    the same subject (`two_hop.with_distractors`): the memory's relation matching returns near relations too (the
    father with the mother), best first, and a reader trained only on single results may take the wrong one."""
    keep_reads: bool = False
    """The reader is decoded with its complete reads kept in the context when it opens the next one
    (`CallBook.keep_reads`; the paper removes them): each two-hop question is then one example holding both
    reads, the context that reader meets."""
    misread_rate: float = 0.0
    """Share of the query results replaced by another entity the text named before the read (`read_examples.
    misread`): the paper answers training reads from the imperfect memory its writer wrote, so the reader learns
    that a result may be wrong; 0 answers every read from the gold triples."""
    counterfactual: int = 0
    """Counterfactual variants of the documents added to these examples (as `WriteRecipe.counterfactual`)."""

    BOUNDS: ClassVar[dict] = {"q_thr": "positive", "max_queries": "positive", "context_free": "nonnegative",
                              "question_form": "nonnegative", "absent_questions": "nonnegative",
                              "two_hop": "nonnegative", "two_hop_distractors": "fraction", "misread_rate": "fraction",
                              "counterfactual": "nonnegative"}
    CHOICES: ClassVar[dict] = {"absent_form": ("question", "cloze", "mixed")}
