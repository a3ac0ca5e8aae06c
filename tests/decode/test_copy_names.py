"""Copied names in memory-write decoding (`decode.copy_names`), against scripted writers whose every preference
is known: names come from the prompt's text, relations from the labels, and the model's order decides among them."""

import numpy as np
import pytest

from memllm_jax import protocol
from memllm_jax.decode import copy_names
from memllm_jax.decode.item_bans import ban_spec
from memllm_jax.decode.refill import refill_writes
from memllm_jax.decode.scripted import CharTokenizer, PolicyModel
from memllm_jax.decode.writer import WriteDecoding, decode_writes

TOK = CharTokenizer(extra=[">>"])
MEM_WRITE, CLOSE = TOK.marker_id[protocol.MEM_WRITE], TOK.marker_id[protocol.CALL_END]
LABELS = ("born in", "country")


def prompt(text: str) -> list[int]:
    return [TOK.bos_id] + TOK.encode(protocol.format_write_prompt("", text)) + [MEM_WRITE]


def preferring(script: dict[str, str]):
    """A writer that, given the call body so far, prefers the characters `script` lists for the longest key that
    ends the body (a string of characters in order of preference; `}` is the closing token, `;` and `>` the
    separators), else closes the call."""
    def policy(ctx: list[int]) -> list[int]:
        if MEM_WRITE not in ctx:
            return [0]
        body = TOK.decode(ctx[ctx.index(MEM_WRITE) + 1:])
        keys = [k for k in script if body.endswith(k)]
        prefs = script[max(keys, key=len)] if keys else "}"
        return [CLOSE if c == "}" else TOK.encode(">>")[0] if c == ">" else TOK.encode(c)[0] for c in prefs]
    return PolicyModel(policy, TOK.vocab_size)


def decode(model, prompts, copy=True, labels=LABELS, **kw):
    spec = copy_names.copy_spec(TOK, labels, top_k=kw.pop("top_k", 8)) if copy else None
    dec = WriteDecoding(kw.pop("max_new_tokens", 40), late_stopping=False, copy=spec, **kw)
    return [o["text"] for o in decode_writes(model, TOK, prompts, dec, make_cache=model.make_cache,
                                              share_prefixes=False)]


# The writer prefers "Lix" (no such word) over "Lisbon" and "Lima" (in the text), and a made-up relation.
WRITER = {"": "PL}", "P": "ea", "Pe": "dr", "Ped": "r", "Pedr": "o", "Pedro": "> ", "Pedro>>": "bx}",
          ">>b": "oe", ">>be": "r", ">>bo": "r", ">>bor": "n", ">>born": " ", ">>born ": "i", ">>born i": "n",
          ">>born in": ">", "in>>": "L", ">>L": "i", ">>Li": "xsm", ">>Lis": "b", ">>Lisb": "o", ">>Lisbo": "n",
          ">>Lim": "a", ">>Lix": ";", ">>Lisbon": ";", ">>Lima": ";", ";": "}"}


def test_without_copying_the_writer_writes_a_name_that_is_not_in_the_text():
    out, = decode(preferring(WRITER), [prompt("Pedro was born in Lisbon.")], copy=False)
    assert out == "({MEM_WRITE-->Pedro>>born in>>Lix;})"


def test_names_are_copied_from_the_prompt_in_the_models_order():
    """`Lix` is in no text, so the object is the model's next choice `Lis...`: `Lisbon`; with `Lima` in the text
    instead the same writer writes `Lima`."""
    lisbon, lima = decode(preferring(WRITER), [prompt("Pedro was born in Lisbon."), prompt("Pedro was born in Lima.")])
    assert lisbon == "({MEM_WRITE-->Pedro>>born in>>Lisbon;})"
    assert lima == "({MEM_WRITE-->Pedro>>born in>>Lima;})"


@pytest.mark.slow
def test_a_relation_is_a_known_label_and_unknown_labels_leave_it_free():
    """`x` is no label: the writer's next choice `b` leads to `born in`. Without labels the relation is free."""
    writer = preferring({**WRITER, "Pedro>>": "xb", ">>x": ">", "x>>": "L"})
    out, = decode(writer, [prompt("Pedro was born in Lisbon.")])
    assert out == "({MEM_WRITE-->Pedro>>born in>>Lisbon;})"
    out, = decode(writer, [prompt("Pedro was born in Lisbon.")], labels=())
    assert out == "({MEM_WRITE-->Pedro>>x>>Lisbon;})"


def test_a_name_ends_only_at_a_word_end():
    """`Ped>>` would cut the word `Pedro`: the separator is refused there until the name is whole."""
    out, = decode(preferring({**WRITER, "Ped": ">r"}), [prompt("Pedro was born in Lisbon.")])
    assert out == "({MEM_WRITE-->Pedro>>born in>>Lisbon;})"


@pytest.mark.slow
def test_names_start_at_word_starts_and_never_span_a_marker():
    """The text has `Pedro` only inside `XPedro`: a subject may not start there, so the writer's next choice, to
    close the call, is taken. Markers are 0 bytes of the source, which no name can contain."""
    src = copy_names.prompt_bytes(prompt("XPedro was born in Lisbon."), copy_names.copy_spec(TOK, LABELS))
    assert src == b"\0\0XPedro was born in Lisbon.\0\0"
    out, = decode(preferring({"": "P}"}), [prompt("XPedro was born in Lisbon.")])
    assert out == "({MEM_WRITE-->})"
    out, = decode(preferring({"": "P}"}), [prompt("X Pedro was born in Lisbon.")])
    assert out.startswith("({MEM_WRITE-->P")


@pytest.mark.slow
def test_rows_keep_their_own_texts_in_a_refilled_pool_and_agree_with_batches():
    texts = ["Pedro was born in Lisbon.", "Pedro was born in Lima.", "Pedro lived in Lima; born in Lisbon."] * 3
    prompts = [prompt(t) for t in texts]
    model = preferring(WRITER)
    batched = decode(model, prompts)
    spec = copy_names.copy_spec(TOK, LABELS, top_k=8)
    pooled = [o["text"] for o in refill_writes(model, TOK, prompts, WriteDecoding(40, late_stopping=False, copy=spec),
                                              pool=2, make_cache=model.make_cache, share_prefixes=False)]
    assert pooled == batched
    assert batched[:2] == ["({MEM_WRITE-->Pedro>>born in>>Lisbon;})", "({MEM_WRITE-->Pedro>>born in>>Lima;})"]


@pytest.mark.slow
def test_copying_with_bans_restarts_the_field_after_a_rewind():
    """A writer that loops on `Pedro>>born in>>Lisbon;` is rewound by the ban to the item start, where `P` is
    banned: its next subject choice `L` starts `Lisbon`/`Lima` (copied), and the call goes on from there."""
    loop = {**WRITER, ";": "PL}", ";L": "i", ";Li": "sm", ";Lis": "b", ";Lisb": "o", ";Lisbo": "n", ";Lisbon": ">",
            "Lisbon>>": "c", ">>c": "o", ">>co": "u", ">>cou": "n", ">>coun": "t", ">>count": "r", ">>countr": "y",
            ">>country": ">", "country>>": "P", ">>P": "e", ">>Pe": "d", ">>Ped": "r", ">>Pedr": "o", ">>Pedro": ";",
            "Pedro;": "}"}
    model = preferring(loop)
    out, = decode(model, [prompt("Pedro was born in Lisbon.")], bans=ban_spec(TOK, 2), max_new_tokens=80)
    items = [(t.subject, t.relation, t.object) for t in protocol.parse_write_call(out).items]
    assert items[:2] == [("Pedro", "born in", "Lisbon"), ("Lisbon", "country", "Pedro")]


def test_token_table_of_a_byte_level_tokenizer_gives_back_the_text(tmp_path):
    from memllm_jax.tokenizer import train_tokenizer

    texts = ["Pedro was born in Lisbon, Portugal.", "São Paulo (Brazil) is a city; Zürich too."] * 20
    tok = train_tokenizer(texts, vocab_size=400, out_dir=tmp_path)
    table = copy_names.token_table(tok)
    for text in texts[:2]:
        assert b"".join(table[i] for i in tok.encode(text)) == text.encode("utf-8")
    assert table[tok.marker_id[protocol.CALL_END]] is None and table[tok.eos_id] is None


def test_sources_put_the_text_first_and_the_labels_last():
    spec = copy_names.with_room_for(copy_names.copy_spec(TOK, LABELS), [prompt("ab")])
    src = copy_names.sources([prompt("ab")], spec, rows=2)
    tail = b"\0born in\0country\0"
    assert src.shape == (2, spec.source_len) and spec.source_len % 256 == 0
    assert bytes(src[0, -len(tail):]) == bytes(src[1, -len(tail):]) == tail
    assert b"ab" in bytes(src[0, :8]) and not np.any(src[1, :-len(tail)])
    with pytest.raises(ValueError, match="room for"):
        copy_names.sources([prompt("x" * 400)], spec)


@pytest.mark.slow
def test_on_the_real_decoder_every_item_is_copied_when_the_whole_vocabulary_is_searched():
    """A random-weight decoder, top_k = the vocabulary: no fallback is ever needed (a field can always go on by
    one byte or end), so every parsed item's names are pieces of its prompt's text that start and end at word
    boundaries and its relation is a label; without copying the same model writes names found in no text."""
    import dataclasses
    import re

    from flax import nnx

    from memllm_jax.config import TINY
    from memllm_jax.model.mistral import Mistral, init_cache

    cfg = dataclasses.replace(TINY, vocab_size=TOK.vocab_size)
    model = Mistral(cfg, rngs=nnx.Rngs(8))  # a seed whose calls are not all empty
    texts = ["Pedro was born in Lisbon.", "Ana Lima lives in Porto, Portugal.", "The Tagus flows to Lisbon."] * 2
    prompts = [prompt(t) for t in texts]
    spec = copy_names.copy_spec(TOK, LABELS, top_k=TOK.vocab_size)
    make_cache = lambda b, n: init_cache(cfg, b, n)  # noqa: E731
    runs = {copy: decode_writes(model, TOK, prompts, WriteDecoding(48, late_stopping=False, copy=spec if copy else None),
                                make_cache=make_cache, share_prefixes=False) for copy in (True, False)}
    copied = [(text, t) for text, o in zip(texts, runs[True]) for t in protocol.parse_write_call(o["text"]).items]
    assert len(copied) >= 3
    for text, t in copied:
        assert t.relation in LABELS
        for name in (t.subject, t.object):
            assert re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text), (name, text)
            assert not name.endswith((",", " "))
    free = [o["text"] for o in runs[False]]
    assert any(o not in {c["text"] for c in runs[True]} for o in free)


@pytest.mark.slow
def test_the_memory_stage_and_the_edits_keep_the_copied_triple_the_grounding_check_dropped(monkeypatch):
    """`write_copied_names`: the memory stage's evaluation write keeps `Pedro>>born in>>Lisbon`, where without
    copying the writer's `Lix` fails the grounding check; Table 3's edits are written with the same decoding."""
    import types

    import data_gen.gold_memory
    from memllm_jax.eval.write_quality import EntityGold
    from experiments import stages
    from experiments.pipeline_config import PipelineConfig
    from memllm_jax.memory.encoder import HashEncoder

    gold = protocol.Triple("Pedro", "born in", "Lisbon")
    monkeypatch.setattr(data_gen.gold_memory, "gold_triples", lambda doc: [gold])
    monkeypatch.setattr(data_gen.gold_memory, "entity_gold", lambda doc: EntityGold([{"Pedro"}, {"Lisbon"}],
                                                                                    {(0, "born in", 1)}))
    monkeypatch.setattr(stages, "_labels", lambda self: dict(zip(("P19", "P17"), LABELS)))
    model = preferring(WRITER)
    monkeypatch.setattr(stages, "_write_budget", lambda self, min_confidence, _orig=stages._write_budget: {
        **_orig(self, min_confidence), "make_cache": model.make_cache})
    infos = {}
    for copied in (False, True):
        cfg = PipelineConfig(write_grounded=True, write_late_stopping=False, write_max_new_tokens=40, write_batch=1,
                             write_copied_names=copied)
        pipe = types.SimpleNamespace(cfg=cfg, encoder=lambda: HashEncoder(16), tokenizer=lambda: TOK)
        mem, infos[copied] = stages._write_eval(pipe, model, [("x", ["Pedro was born in Lisbon."])], None)
        assert (stages._edit_checks(pipe)["write_decoding"].copy is not None) is copied
    assert infos[False]["ungrounded"] == 1 and infos[False]["correct"] == 0
    assert infos[True]["ungrounded"] == 0 and infos[True]["correct"] == 1 and infos[True]["precision"] == 1.0
    # the edits copy relations from the same labels
    assert stages._edit_checks(pipe)["write_decoding"].copy.labels == copy_names.copy_spec(TOK, LABELS).labels
