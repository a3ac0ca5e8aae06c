"""The judge's training examples (`data_gen.judge_examples`): positives are the sentences' memory-write targets
under their gold names, negatives are never gold triples, and the records train the one answer token."""

from data_gen.docred import parse_document
from data_gen.gold_memory import gold_triples
from data_gen.judge_examples import NEGATIVE_KINDS, judge_items, judge_records, relations_by_types
from data_gen.write_examples import iter_write_items
from memllm_jax import protocol as P
from memllm_jax.eval.write_quality import triple_key
from tests.data.test_data_examples import LABELS, RAW


def _doc():
    return parse_document(RAW, 0, LABELS, "golden.json")


def test_positives_are_the_taught_gold_triples_and_negatives_are_never_gold():
    doc = _doc()
    items = judge_items(doc, relations_by_types([doc]), negatives=3)
    gold = {triple_key(t) for t in gold_triples(doc)}
    taught = {(item.sent_id, t) for item in iter_write_items(doc, evidence=True) for t in item.triples}
    positives = {(i.sent_id, i.triple) for i in items if i.label}
    assert positives == {(s, t) for s, t in taught if triple_key(t) in gold} and positives
    negatives = [i for i in items if not i.label]
    assert negatives and all(triple_key(i.triple) not in gold and i.kind in NEGATIVE_KINDS for i in negatives)
    assert P.Triple("Latina", "place of birth", "Tiziano Ferro") in {i.triple for i in negatives if i.kind == "reversed"}
    for s in {i.sent_id for i in items}:  # at most `negatives` per positive, no repeats
        mine = [i for i in items if i.sent_id == s]
        assert sum(not i.label for i in mine) <= 3 * max(1, sum(i.label for i in mine))
        assert len({triple_key(i.triple) for i in mine}) == len(mine)
    # the context is the text up to and including the sentence
    assert {i.context for i in items if i.sent_id == 1} == {doc.text[:doc.sentences[1][1]]}


def test_records_train_the_answer_token_only_and_are_reproducible():
    doc = _doc()
    records = judge_records([doc], negatives=2, seed=1)
    assert records == judge_records([doc], negatives=2, seed=1)
    for r in records:
        prompt, answer = r["segments"]
        assert not prompt["loss"] and answer["loss"] and r["eos"] is False
        assert answer["text"] == P.JUDGE_ANSWERS[0 if r["label"] else 1]
        assert prompt["text"].endswith("Answer:") and " | ".join(r["triple"]) in prompt["text"]
    assert [r["sent_id"] for r in records] == sorted(r["sent_id"] for r in records)  # a document's examples in order
