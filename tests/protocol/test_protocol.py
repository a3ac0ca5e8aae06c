"""Property tests of the protocol: format -> parse round trips, parsers never raise, escaping."""

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from memllm_jax import protocol as P

ALPHABET = string.ascii_letters + string.digits + " ()>;{}-_.,'\"é" + P.ESC
names = st.text(alphabet=ALPHABET, min_size=1, max_size=20).map(str.strip).filter(bool)
tricky = st.sampled_from(["a>>b", "x;y", "c})", "({MEM_READ(", ")-->", "})", ">", ";", "({USER_ST})", P.ESC + "z"])
any_name = st.one_of(names, tricky, st.tuples(names, tricky, names).map(lambda t: "".join(t).strip())).filter(bool)
triples = st.builds(P.Triple, any_name, any_name, any_name)
queries = st.one_of(st.builds(lambda s, r: P.Query(s, r, None), any_name, any_name),
                    st.builds(lambda r, o: P.Query(None, r, o), any_name, any_name))


@settings(max_examples=200, deadline=None)
@given(st.lists(triples, max_size=5))
def test_write_round_trip(ts):
    parsed = P.parse_write_call(P.format_write_call(ts))
    assert parsed.ok and parsed.items == tuple(ts)


@settings(max_examples=200, deadline=None)
@given(st.lists(queries, min_size=1, max_size=4), st.lists(any_name, max_size=4))
def test_read_round_trip(qs, results):
    text = "prefix " + P.format_read_call(qs) + P.format_read_result(results)
    parsed = P.parse_read_call(text)
    assert parsed.ok and parsed.items == tuple(qs)
    body = P.format_read_result(results)[: -len(P.CALL_END)]
    assert P.parse_entities(body) == [r for r in results]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_escape_round_trip_and_no_marker(text):
    esc = P.escape_text(text)
    assert P.unescape_text(esc) == text
    assert not any(m in esc for m in P.MARKERS) and P.CALL_OPEN not in esc
    esc2, off = P.escape_text_with_offsets(text)
    assert esc2 == esc and len(off) == len(text) + 1 and off[-1] == len(esc)
    assert all(esc[off[i] + (off[i + 1] - off[i] - 1)] == ch for i, ch in enumerate(text))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET + "MEAD_WRITUSN", max_size=60))
def test_parsers_never_raise_on_arbitrary_text(text):
    for parse in (P.parse_write_call, P.parse_read_call, P.parse_triples, P.parse_queries):
        r = parse(text)
        assert isinstance(r, P.Parsed)
    P.parse_entities(text)
    P.strip_calls(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(triples, min_size=1, max_size=3), st.lists(queries, min_size=1, max_size=3),
       st.integers(0, 200), st.integers(0, 200), st.sampled_from(["cut", "drop", "dup", "insert"]))
def test_parsers_never_raise_on_mutated_calls(ts, qs, i, j, how):
    for text in (P.format_write_call(ts), P.format_read_call(qs) + "a;b})"):
        i2, j2 = sorted((i % (len(text) + 1), j % (len(text) + 1)))
        mutated = {"cut": text[:i2], "drop": text[:i2] + text[j2:], "dup": text[:j2] + text[i2:],
                   "insert": text[:i2] + ">>;})({" + text[i2:]}[how]
        w, r = P.parse_write_call(mutated), P.parse_read_call(mutated)
        assert isinstance(w, P.Parsed) and isinstance(r, P.Parsed)
        if how == "cut" and i2 < len(text) and text.startswith(P.MEM_WRITE):
            assert not w.ok  # a truncated write is reported, never silently accepted as complete


def test_strip_calls_restores_document():
    doc = "A text with ({ braces }) and )--> arrows " + P.ESC
    formatted = P.escape_text(doc[:10]) + P.format_read_call([P.Query("x", "r", None)]) + "y})" + P.escape_text(doc[10:])
    assert P.strip_calls(formatted) == doc
