"""Tokenizer: markers are single special ids; escaped text never encodes to a marker id; HF dirs load."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memllm_jax import protocol as P
from memllm_jax.tokenizer import load_tokenizer, train_tokenizer

CORPUS = [P.escape_text(t) for t in [
    "Alla Mia Età is an album by Tiziano Ferro ({like this}) and })( or )--> here.",
    "He was born in Latina. The song Il Regalo Più Grande is part of Alla Mia Età.",
    "Kilak Banaeth was employed by Klaisti Corporation, headquartered in Zoudetheir.",
]] * 20 + [P.format_read_call([P.Query("a", "performer", None)]) + "b})"] * 5


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(CORPUS, 320, tmp_path_factory.mktemp("tok"))


def test_markers_are_single_ids(tok):
    assert len(set(tok.marker_id.values())) == len(P.MARKERS)
    for m, i in tok.marker_id.items():
        assert tok.encode(m) == [i]
    call = P.format_read_call([P.Query("Loud", "performer", None)]) + P.format_read_result(["Rihanna"])
    ids = tok.encode(call)
    assert ids[0] == tok.marker_id[P.MEM_READ] and ids[-1] == tok.marker_id[P.CALL_END]
    assert tok.marker_id[P.READ_END] in ids and tok.decode(ids) == call
    assert len({tok.bos_id, tok.eos_id, tok.pad_id}) == 3 and tok.vocab_size <= 320
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == call


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("({})->;MEM_READWRITUSN abc") + [P.ESC, "é"]), max_size=60))
def test_escaped_text_never_encodes_to_a_marker(tmp_path_factory, text):
    tok = _TOK.get("t") or _TOK.setdefault("t", train_tokenizer(CORPUS, 320, None))
    ids = tok.encode(P.escape_text(text))
    assert not set(ids) & tok.marker_ids
    assert P.unescape_text(tok.decode(ids)) == text


_TOK: dict = {}


def test_save_load_round_trip(tok, tmp_path):
    path = tok.save(tmp_path / "again")
    tok2 = load_tokenizer(path)
    assert tok2.marker_id == tok.marker_id and tok2.encode(CORPUS[0]) == tok.encode(CORPUS[0])


def test_hf_directory_gets_markers(tmp_path):
    from tokenizers import Tokenizer as HFTok, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = HFTok(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                        show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    hf.save_pretrained(str(tmp_path))
    tok = load_tokenizer(tmp_path)
    assert set(tok.marker_id) == set(P.MARKERS) and min(tok.marker_id.values()) >= 300 - 1
    assert tok.encode(P.MEM_WRITE + "a>>b>>c" + P.CALL_END)[0] == tok.marker_id[P.MEM_WRITE]
    assert tok.eos_id == hf.eos_token_id and tok.pad_id == tok.eos_id  # no pad token: EOS pads


def test_too_small_vocab_is_a_clear_error():
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(CORPUS, 100, None)


def test_training_on_api_examples_never_merges_across_a_marker():
    """`>>` followed by `)-->` is frequent in read calls; BPE must not learn a token spelling a marker."""
    calls = [f"{P.MEM_READ}Ann Lee>>employer>>{P.READ_END}Kerek Group{P.CALL_END}Kerek Group." for _ in range(200)]
    tok = train_tokenizer(calls + ["Ann Lee worked for Kerek Group."] * 50, 300 + len(P.MARKERS) + 4)
    ids = tok.encode(calls[0])
    assert tok.decode(ids) == calls[0]
    assert tok.marker_id[P.READ_END] in ids and tok.marker_id[P.CALL_END] in ids
    assert len(tok.encode(">>")) == 1  # the separator itself did become one token


def test_names_use_the_same_tokens_in_text_and_in_api_fields():
    texts = ["She worked for Kerek Group in 1956.", f"{P.MEM_WRITE}Mae Gidrun>>employer>>Kerek Group{P.CALL_END}"] * 100
    tok = train_tokenizer(texts, 300 + len(P.MARKERS) + 4)
    in_text = tok.encode("She worked for Kerek Group in 1956.")
    in_call = tok.encode("Mae Gidrun>>employer>>Kerek Group;x>>born>>1956")
    name = tok.encode("Kerek Group")
    assert any(in_text[i:i + len(name)] == name for i in range(len(in_text)))
    assert any(in_call[i:i + len(name)] == name for i in range(len(in_call)))
    assert tok.encode("1956")[0] in in_text
    plain = train_tokenizer(texts, 300 + len(P.MARKERS) + 4, name_spaces=False)
    text_ids = plain.encode("She worked for Kerek Group in 1956.")
    assert not any(text_ids[i:i + 2] == plain.encode("Kerek Group")[:2] for i in range(len(text_ids)))
