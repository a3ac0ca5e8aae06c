"""Repeated-item bans in memory-write decoding (`decode.item_bans`), against scripted models whose every choice is
known: a looping call rewinds and takes its next choice instead of writing an item again."""

import pytest

from memllm_jax import protocol
from memllm_jax.decode.item_bans import ban_spec, span_hash
from tests.support.scripted import CharTokenizer, PolicyModel
from memllm_jax.decode.writer import WriteDecoding, decode_writes

TOK = CharTokenizer(extra=[">>"])
CLOSE = TOK.marker_id[protocol.CALL_END]
PROMPT = TOK.encode("Some text.") + [TOK.marker_id[protocol.MEM_WRITE]]


def scripted(subjects: str, relations: str, objects: dict[str, str]):
    """A writer that knows items `s>>r>>objects[s]`: at an item start it prefers the subjects in the order given
    (then the closing token), after `s>>` the relations in order (then closing), and it always writes the item
    again after finishing one: an endless loop without bans."""
    def policy(ctx: list[int]) -> list[int]:
        if TOK.marker_id[protocol.MEM_WRITE] not in ctx:  # the prompt, prefilled
            return [0]
        body = TOK.decode(ctx[ctx.index(TOK.marker_id[protocol.MEM_WRITE]) + 1:])
        item = body.split(";")[-1]
        fields = item.split(">>")
        if item == "":
            return TOK.encode(subjects) + [CLOSE]
        if len(fields) == 1:
            return TOK.encode(">>")
        if len(fields) == 2:
            return (TOK.encode(relations) + [CLOSE]) if fields[1] == "" else TOK.encode(">>")
        target = objects[fields[0]]
        return TOK.encode(target[len(fields[2])]) if len(fields[2]) < len(target) else TOK.encode(";")
    return PolicyModel(policy, TOK.vocab_size)


def decode(model, n_bans: int | None, field: int = 0, max_new_tokens: int = 60, prompts=(PROMPT,)):
    bans = None if n_bans is None else ban_spec(TOK, n_bans, field)
    return decode_writes(model, TOK, list(prompts), WriteDecoding(max_new_tokens, late_stopping=False, bans=bans),
                         make_cache=model.make_cache, share_prefixes=False)


def items(out: dict) -> list[tuple[str, str, str]]:
    return [(t.subject, t.relation, t.object) for t in protocol.parse_write_call(out["text"]).items]


def test_without_bans_the_scripted_writer_loops_to_the_budget():
    out, = decode(scripted("ac", "r", {"a": "b", "c": "d"}), None)
    assert out["stop"] == "budget" and out["text"].startswith("({MEM_WRITE-->a>>r>>b;a>>r>>b;a>>r>>b;")


def test_a_repeated_item_rewinds_to_its_subject_and_takes_the_next_one():
    """`a>>r>>b;` then `a>>r>>b` again: rewind to the item start, ban `a` there, write `c>>r>>d;`; its repeat bans
    `c`, and the next choice closes the call."""
    out, = decode(scripted("ac", "r", {"a": "b", "c": "d"}), 8)
    assert out["text"] == "({MEM_WRITE-->a>>r>>b;c>>r>>d;})" and out["stop"] == "late_stop"
    assert items(out) == [("a", "r", "b"), ("c", "r", "d")]


def test_a_relation_level_ban_keeps_the_subject_and_takes_the_next_relation():
    """field=1: the ban is on the relation after the same subject: `a>>r>>b;a>>s>>b;`, then both relations of `a`
    are banned and the writer closes (its unfinished `a>>` is dropped)."""
    out, = decode(scripted("a", "rs", {"a": "b"}), 8, field=1)
    assert items(out) == [("a", "r", "b"), ("a", "s", "b")]
    assert out["text"].startswith("({MEM_WRITE-->a>>r>>b;a>>s>>b;")


def test_a_row_out_of_bans_stops_before_the_repeated_item():
    out, = decode(scripted("ac", "r", {"a": "b", "c": "d"}), 1)
    assert out["stop"] == "repeat" and out["text"] == "({MEM_WRITE-->a>>r>>b;c>>r>>d;"
    assert items(out) == [("a", "r", "b"), ("c", "r", "d")]


@pytest.mark.slow
def test_bans_change_nothing_for_a_call_without_repeats_and_rows_are_independent():
    """A writer that closes after its items writes the same with and without bans, beside a looping row."""
    def closing(ctx):
        if TOK.marker_id[protocol.MEM_WRITE] not in ctx:
            return [0]
        body = TOK.decode(ctx[ctx.index(TOK.marker_id[protocol.MEM_WRITE]) + 1:])
        script = "x>>r>>y;z>>r>>w;"
        return TOK.encode(script[len(body)]) if len(body) < len(script) else [CLOSE]

    plain = decode(PolicyModel(closing, TOK.vocab_size), None)
    model = PolicyModel(closing, TOK.vocab_size)
    with_bans = decode(model, 8)
    assert [o["text"] for o in with_bans] == [o["text"] for o in plain] == ["({MEM_WRITE-->x>>r>>y;z>>r>>w;})"]

    looping = scripted("ac", "r", {"a": "b", "c": "d"})
    pair = decode(looping, 8, prompts=(PROMPT, PROMPT + TOK.encode("")))
    assert [o["text"] for o in pair] == ["({MEM_WRITE-->a>>r>>b;c>>r>>d;})"] * 2


@pytest.mark.slow
def test_span_hash_depends_on_the_tokens_and_their_order_only():
    import jax.numpy as jnp

    out = jnp.array([[5, 6, 7, 0], [9, 5, 6, 7], [6, 5, 7, 0]], jnp.int32)
    h = span_hash(out, jnp.array([0, 1, 0]), jnp.array([3, 4, 3])).tolist()
    assert h[0] == h[1] and h[0] != h[2]
    assert span_hash(out, jnp.array([0]), jnp.array([0]))[0] == span_hash(out, jnp.array([2]), jnp.array([2]))[0]


def test_tokenizers_without_single_separator_tokens_are_refused():
    with pytest.raises(ValueError, match="'>>' to be one token"):
        ban_spec(CharTokenizer(), 8)


@pytest.mark.slow
def test_with_late_stopping_the_call_is_cut_at_its_best_point_after_the_rewinds():
    """Late stopping records a cut point once both subjects are banned and takes the runner-up (a junk token);
    the call is cut at the best point: the two items and the closing token."""
    model = scripted("ac", "r", {"a": "b", "c": "d"})
    out, = decode_writes(model, TOK, [PROMPT], WriteDecoding(60, late_stopping=True, bans=ban_spec(TOK, 8)),
                         make_cache=model.make_cache, share_prefixes=False)
    assert out["text"] == "({MEM_WRITE-->a>>r>>b;c>>r>>d;})" and out["cut"] == len(TOK.encode("a>>r>>b;c>>r>>d;"))


@pytest.mark.slow
def test_a_rewound_real_kv_cache_gives_the_logits_of_the_shorter_context():
    """What a rewind relies on in the real decoder: with the cache length set back to L - 1 and token L - 1 fed
    again, the next-token logits equal those computed when the context first had L tokens (later slots are
    stale and must be ignored)."""
    import dataclasses

    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from memllm_jax.config import TINY
    from memllm_jax.model.decoder import Decoder, init_cache

    cfg = dataclasses.replace(TINY, vocab_size=TOK.vocab_size)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    ids = TOK.encode("a>>r>>b;c>>r>>d;")
    cache = init_cache(cfg, 1, 64)
    logits_at = []
    for t in ids:
        logits, cache = model(jnp.array([[t]]), cache.lengths_B[:, None], jnp.ones((1, 1), bool), cache=cache)
        logits_at.append(np.asarray(logits[0, 0]))
    back = 8  # rewind to 8 tokens: feed token 7 again at slot 7
    cache = cache.replace(lengths_B=jnp.array([back - 1], jnp.int32))
    logits, cache = model(jnp.array([[ids[back - 1]]]), cache.lengths_B[:, None], jnp.ones((1, 1), bool), cache=cache)
    assert int(cache.lengths_B[0]) == back
    np.testing.assert_allclose(np.asarray(logits[0, 0]), logits_at[back - 1], atol=1e-5)
