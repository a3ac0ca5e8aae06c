"""Protocol smoke tests (the property tests live in tests/protocol/test_protocol.py)."""

from memllm_jax import protocol as P


def test_write_call_format_and_parse():
    triples = [P.Triple("Alla Mia Età", "performer", "Tiziano Ferro"), P.Triple("a>>b", "r;x", "c})")]
    call = P.format_write_call(triples)
    assert call.startswith("({MEM_WRITE-->") and call.endswith("})")
    assert P.parse_write_call(call).items == tuple(triples)
    assert P.format_write_call([]) == "({MEM_WRITE-->})"


def test_read_call_format_and_parse():
    queries = [P.Query("Il Regalo Più Grande", "part of", None), P.Query(None, "performer", "Tiziano Ferro")]
    call = P.format_read_call(queries)
    assert call == "({MEM_READ(Il Regalo Più Grande>>part of>>;>>performer>>Tiziano Ferro)-->"
    assert P.parse_read_call(call + "Alla Mia Età})").items == tuple(queries)


def test_truncated_and_malformed_never_raise():
    assert not P.parse_write_call("({MEM_WRITE-->a>>b").complete
    assert P.parse_read_call("({MEM_READ(a>>b>>c)-->").errors
    assert P.parse_read_call("garbage").errors


def test_truncated_write_keeps_only_items_closed_by_separator():
    cut = P.parse_write_call("({MEM_WRITE-->Loud Tour>>performer>>Rihanna;Rihanna>>country of citizenship>>Barb")
    assert cut.items == (P.Triple("Loud Tour", "performer", "Rihanna"),) and not cut.complete
    assert any(e.startswith(P.TRUNCATION_NOTES[0]) for e in cut.errors)
    whole_items = P.parse_write_call("({MEM_WRITE-->a>>r>>b;c>>r>>d;")
    assert whole_items.items == (P.Triple("a", "r", "b"), P.Triple("c", "r", "d")) and not whole_items.complete
    assert P.parse_write_call("({MEM_WRITE-->a>>r>>b").items == ()  # the only item is unfinished


def test_empty_read_kept_in_the_context_format_and_parse():
    queries = [P.Query("Ann Vu", "employer", None)]
    empty = P.format_empty_read(queries)
    assert empty == "({MEM_READ(Ann Vu>>employer>>)-->})"
    assert P.parse_read_call(empty).items == tuple(queries)
    assert P.parse_read_result("Ann worked for" + empty + " " + P.ABSTAIN) == ()
    assert P.parse_read_result(P.format_read_call(queries) + P.format_read_result(["Kerek", "a;b"])) == ("Kerek", "a;b")
    assert P.parse_read_result(P.format_read_call(queries)) is None  # not answered yet
    assert P.parse_read_result("no call") is None
    # the last call counts; the phrase is plain text, left by strip_calls
    assert P.parse_read_result(empty + P.format_read_call(queries) + "X})") == ("X",)
    assert P.strip_calls("Ann worked for" + empty + " " + P.ABSTAIN + ".") == "Ann worked for unknown."
    assert P.ABSTAIN not in P.MARKERS and P.escape_text(P.ABSTAIN) == P.ABSTAIN
