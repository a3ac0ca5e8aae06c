"""Small stand-ins shared by the eval tests: a character tokenizer with the protocol's markers."""

from memllm_jax import protocol


class CharTokenizer:
    """pad 0, bos 1, eos 2, the six markers 3..8, printable ASCII 9..103, ESC 104, line break 105 (any other
    character is read as a space)."""

    vocab_size = 128
    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self):
        self.marker_id = {m: 3 + i for i, m in enumerate(protocol.MARKERS)}
        self._marker_of = {v: k for k, v in self.marker_id.items()}

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for m, mid in self.marker_id.items():
                if text.startswith(m, i):
                    ids.append(mid)
                    i += len(m)
                    break
            else:
                ch = text[i]
                ids.append(104 if ch == protocol.ESC else 105 if ch == "\n" else 9 + min(max(ord(ch) - 32, 0), 94))
                i += 1
        return ids

    def decode(self, ids) -> str:
        out = []
        for t in ids:
            t = int(t)
            if t in self._marker_of:
                out.append(self._marker_of[t])
            elif t == 104:
                out.append(protocol.ESC)
            elif t == 105:
                out.append("\n")
            elif 9 <= t < 104:
                out.append(chr(t - 9 + 32))
        return "".join(out)


def scripted_reader(text: str = "Ann was born in Paris.", read_at: tuple[int, ...] = (16,)):
    """`(model, tokenizer, [encoded doc], Memory class)`: a scripted model that reads right before "Paris" in
    "Ann was born in Paris." asking <Ann, place of birth, *>, and a memory answering that query with Paris.
    `text` / `read_at`: another document, read before each of these characters (the same query each time)."""
    from tests.support.scripted import PolicyModel
    from memllm_jax.eval.records import EvalDoc, GoldRead, encode_document

    tok = CharTokenizer()
    mr, rend, cend = (tok.marker_id[m] for m in (protocol.MEM_READ, protocol.READ_END, protocol.CALL_END))
    query_ids = tok.encode("Ann>>place of birth>>") + [rend]
    doc_ids = tok.encode(text)

    def policy(ctx):
        if mr in ctx:
            k = len(ctx) - 1 - ctx[::-1].index(mr)
            gen = ctx[k + 1:]
            if cend not in gen:
                return [query_ids[len(gen)] if len(gen) < len(query_ids) else tok.eos_id]
        plain, skip = [], False
        for t in ctx[1:]:
            if t == mr:
                skip = True
            elif t == cend:
                skip = False
            elif not skip:
                plain.append(t)
        nxt = doc_ids[len(plain)] if len(plain) < len(doc_ids) else tok.eos_id
        if len(plain) in read_at and ctx[-1] != cend:
            return [mr, nxt]
        return [nxt]

    class Memory:
        def query(self, queries):
            from memllm_jax.decode.io import _Empty
            return [_Empty(["Paris"] if q == protocol.Query("Ann", "place of birth", None) else []) for q in queries]

    d = EvalDoc("d", text, ((0, 3), (16, 21)), (GoldRead(16, (protocol.Query("Ann", "place of birth", None),),
                                                          ("Paris",), ((16, 21),)),), ())
    return PolicyModel(policy, tok.vocab_size), tok, [encode_document(tok, d)], Memory
