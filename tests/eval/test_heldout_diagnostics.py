"""The held-out evaluation world, the overlap report, the copy probe's field labels and scoring, the query
checks at gold read positions, and documents tokenized once."""

import numpy as np
from flax import nnx

from data_gen.docred import documents_from_raw
from data_gen.gold_memory import gold_triples
from data_gen.overlap import heldout_overlap
from data_gen.synthetic import edit_world, heldout_split, iter_synthetic, synthetic_rel_info
from memllm_jax import protocol as P
from memllm_jax.eval.diagnostics import MARKUP, NAME, RELATION, call_char_labels, field_losses, names_in_text
from memllm_jax.eval.perplexity import check_queries
from memllm_jax.eval.records import EvalDoc, GoldRead, encode_document, token_at
from tests.support.eval_fakes import CharTokenizer


def test_heldout_world_states_no_evaluation_fact_in_training():
    train_raw, held_raw = heldout_split(200, 30, seed=7)
    labels = synthetic_rel_info()
    train, held = list(documents_from_raw(train_raw, labels)), list(documents_from_raw(held_raw, labels))
    train_names = {e.name for d in train for e in d.entities}
    held_names = {e.name for d in held for e in d.entities if not e.name[:1].isdigit()}
    assert held_names and not (held_names & train_names)
    targets = [g for d in held for g in (t.object for t in gold_triples(d))]
    o = heldout_overlap(train, held, targets)
    assert o["eval_triples"] > 50 and o["triples_in_train"] == 0.0 and o["named_targets_in_train"] == 0.0
    # the shared-world corpus, split the same way, states many evaluation facts in its training documents
    shared = list(documents_from_raw(iter_synthetic(230, seed=7), labels))
    o_shared = heldout_overlap(shared[:200], shared[200:], [t.object for d in shared[200:] for t in gold_triples(d)])
    assert o_shared["triples_in_train"] > 0.2 and o_shared["named_targets_in_train"] > 0.5


def test_edit_world_shares_no_name_with_the_corpus():
    labels = synthetic_rel_info()
    train_raw, held_raw = heldout_split(200, 30, seed=7)
    corpus = list(documents_from_raw(train_raw + held_raw, labels))
    names = {m.text for d in corpus for e in d.entities for m in e.full_mentions}
    edit_docs = list(documents_from_raw(iter_synthetic(60, world=edit_world(60, seed=7, exclude_names=names)), labels))
    edit_names = {e.name for d in edit_docs for e in d.entities if not e.name[:1].isdigit()}
    assert len(edit_names) > 50 and not (edit_names & names)
    assert heldout_overlap(corpus, edit_docs, [])["triples_in_train"] == 0.0


def test_call_char_labels():
    call = P.format_write_call([P.Triple("Ann Vu", "employer", "Kerek Group"), P.Triple("Ann Vu", "spouse", "Bo")])
    lab = call_char_labels(call)
    text_of = lambda kind: "".join(c if k == kind else "|" for c, k in zip(call, lab))  # noqa: E731
    assert [s for s in text_of(NAME).split("|") if s] == ["Ann Vu", "Kerek Group", "Ann Vu", "Bo"]
    assert [s for s in text_of(RELATION).split("|") if s] == ["employer", "spouse"]
    assert all(k == MARKUP for c, k in zip(call, lab) if c in ">;})")
    read = P.format_read_call([P.Query(None, "performer", "Alla")])
    lab = call_char_labels(read)
    assert "".join(c for c, k in zip(read, lab) if k == NAME) == "Alla"
    assert "".join(c for c, k in zip(read, lab) if k == RELATION) == "performer"


class _CopyModel(nnx.Module):
    """Predicts, at every position, the token that followed the previous occurrence of the current token (an
    induction head), else token 0: a perfect copier of names seen earlier in the sequence."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, tokens_BxL, positions_BxL, attn_mask_BxL=None, cache=None):
        import jax
        import jax.numpy as jnp

        def row(t_L):
            L = t_L.shape[0]
            same_LxL = (t_L[:, None] == t_L[None, :]) & (jnp.arange(L)[None, :] < jnp.arange(L)[:, None])
            last_L = jnp.max(jnp.where(same_LxL, jnp.arange(L)[None, :], -1), axis=1)
            nxt_L = jnp.where(last_L >= 0, t_L[jnp.clip(last_L + 1, 0, L - 1)], 0)
            return jax.nn.one_hot(nxt_L, self.vocab) * 30.0

        return jax.vmap(row)(tokens_BxL), cache


def test_field_losses_copy_probe_on_a_hand_made_case():
    tok = CharTokenizer()
    # the name after "-->" repeats the sentence's first characters; the relation is new text
    rec = {"segments": [{"text": P.format_write_prompt("", "Zaq Xo ran."), "loss": False},
                        {"text": P.format_write_call([P.Triple("Zaq Xo", "r", "Xo")]), "loss": True}]}
    out = field_losses(_CopyModel(tok.vocab_size), tok, [rec])
    assert out["names"] == 2
    # "Zaq Xo": its first character follows a marker (not copyable by this induction model), the rest are
    # copied; "Xo" after ">>" likewise; every relation / markup char is new or ambiguous
    assert 0 < out["name"]["accuracy"] < 1 and out["name"]["tokens"] == len("Zaq Xo") + len("Xo")
    assert out["relation"]["tokens"] == 1 and out["name_exact"] == 0.0


def test_names_in_text_and_query_checks():
    r = names_in_text(["Kerek Group", "kerek  group", "Stopro", ""], "The Kerek Group was founded.")
    assert r == {"names": 3, "in_text": 2, "fraction": 2 / 3}
    gold = [P.Query("Ann Vu", "employer", None)]
    assert check_queries([P.Query("ann vu", "employer", None)], gold) == {
        "gold_position_reads": 1, "query_entity_correct": 1, "query_relation_correct": 1, "query_exact": 1}
    assert check_queries([P.Query("Ann Vu", "spouse", None)], gold)["query_relation_correct"] == 0
    assert check_queries([], gold)["query_entity_correct"] == 0


def test_documents_are_tokenized_once_and_reads_sit_between_tokens():
    tok = CharTokenizer()
    text = "Ann Vu worked for Kerek Group."
    pos = text.index(" Kerek")
    doc = EvalDoc("d", text, ((0, 6), (pos + 1, len(text) - 1)),
                  (GoldRead(pos, (P.Query("Ann Vu", "employer", None),), ("Kerek Group",), ((pos + 1, len(text) - 1),)),), ())
    enc = encode_document(tok, doc)
    assert enc.ids == tok.encode(text)  # Baseline #1 scores the document's own tokenization
    assert enc.read_tokens == [token_at(enc.offsets, pos)] and enc.offsets[enc.read_tokens[0]][0] == pos
    assert np.asarray(enc.masks["target"]).sum() == len("Kerek Group")
