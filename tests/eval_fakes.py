"""Small stand-ins shared by the eval tests: a character tokenizer with the protocol's markers."""

from memllm_jax import protocol


class CharTokenizer:
    """pad 0, bos 1, eos 2, the six markers 3..8, printable ASCII 9..103, ESC 104."""

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
                ids.append(104 if ch == protocol.ESC else 9 + min(max(ord(ch) - 32, 0), 94))
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
            elif 9 <= t < 104:
                out.append(chr(t - 9 + 32))
        return "".join(out)
