"""`memllm bench decode`: memory-read generation and memory writes on the same tiny weights.

(a) Read generation, tokens/s: our batched jitted loop (batch 1 and batch 16, answers prefilled into the
    KV cache, removed calls rewound) vs the original algorithm: HF transformers torch `generate` at
    batch 1 with a stopping criterion at `)-->` and at a new `({MEM_READ(`, re-encoding the whole context
    after every memory call. The torch model is built from our weights (`save_hf`), and both produce the
    same tokens (checked).
(b) Memory writes, sentences/s: batched late-stopping decoding (consecutive batches, and a pool refilled as
    its rows stop, `decode.refill`) vs one sentence at a time, on documents whose prompts share their pretext
    (8-sentence documents, default window) and on a sliding window, each several times the batch; each also as
    a fraction of the roofline: useful FLOPs / seconds / the matmul ceiling measured in the same run
    (`bench.roofline`, `bench.ceiling`), and the FLOPs it executes (padding and idle rows included) / the ceiling.

The weights are a real Mistral whose embedding / LM head are set so that greedy decoding follows a fixed
word-level script with a memory read every ~20 tokens (attention and MLP are computed as usual; their
outputs are scaled down so they perturb but do not override the script). Every contender is timed
interleaved in the same run (bench/timing.py); figures are medians with the half inter-quartile spread.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from typing import Sequence

import numpy as np

from memllm_jax import protocol

WORDS = [f" w{i}" for i in range(24)]
READ_SCRIPT = WORDS[:14] + [protocol.MEM_READ, "Rome>>", "capital of>>", protocol.READ_END, "Italy",
                            protocol.CALL_END] + WORDS[14:20]
WRITE_SCRIPT = ["Ada>>", "born in>>", "London", protocol.CALL_END]
WRITE_NEW_TOKENS = 48
"""Token budget of every write contender."""


class CharTokenizer:
    """Markers are single ids 3..8; every other character is its own id (code point + offset)."""

    pad_id, bos_id, eos_id = 0, 1, 2

    def __init__(self, alphabet: str | None = None, extra: Sequence[str] = ()):
        """`extra`: multi-character tokens, matched (longest first) before single characters."""
        alphabet = alphabet or "".join(chr(c) for c in range(32, 127)) + protocol.ESC
        self.marker_id = {m: 3 + i for i, m in enumerate(protocol.MARKERS)}
        self._pieces = tuple(protocol.MARKERS) + tuple(sorted(extra, key=len, reverse=True))
        symbols = list(alphabet) + [e for e in extra if e not in alphabet]
        self._char_id = {c: 3 + len(protocol.MARKERS) + i for i, c in enumerate(symbols)}
        self._id_str = {v: k for k, v in {**self.marker_id, **self._char_id}.items()}
        self.vocab_size = 3 + len(protocol.MARKERS) + len(symbols)
        # At each position the first of the pieces that matches (markers, then extras longest first), else
        # one character; a regex alternation tries its branches in that order.
        self._split = re.compile("|".join(map(re.escape, self._pieces)) + "|.", re.S).findall
        self._id = {**self._char_id, **self.marker_id}

    def encode(self, text: str) -> list[int]:
        return [self._id[piece] for piece in self._split(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._id_str.get(int(t), "") for t in ids)


def build(cfg_kwargs: dict, seed: int = 0):
    """(model, tokenizer, memory) with a scripted-by-weights Mistral."""
    import jax.numpy as jnp
    from flax import nnx

    from memllm_jax.config import ModelConfig
    from memllm_jax.model.decoder import Decoder

    extra = WORDS + ["Rome>>", "capital of>>", "Italy", "Ada>>", "born in>>", "London", "USER"]
    tok = CharTokenizer(extra=extra)
    cfg_kwargs = dict(cfg_kwargs)
    vocab = max(cfg_kwargs.pop("vocab_size", 256), tok.vocab_size)  # a preset's vocabulary: its head's cost
    cfg = ModelConfig(vocab_size=vocab, sliding_window=None, tie_embeddings=False, **cfg_kwargs)
    model = Decoder(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    D, V = cfg.d_model, cfg.vocab_size
    emb = rng.normal(size=(V, D)).astype(np.float32)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    W = 0.02 * rng.normal(size=(D, V)).astype(np.float32)
    alpha = 16.0 / np.sqrt(D)

    def link(a: str, b: str, weight: float = 1.0):
        W[:, tok.encode(b)[0]] += weight * alpha * unit[tok.encode(a)[0]]

    cycle = READ_SCRIPT + [READ_SCRIPT[0]]
    for a, b in zip(cycle, cycle[1:]):
        if a != protocol.READ_END:  # the memory answers after `)-->`
            link(a, b)
    write = [protocol.MEM_WRITE] + WRITE_SCRIPT
    for a, b in zip(write, write[1:]):
        link(a, b)
    link("London", ";", 0.6)  # late stopping continues with the runner-up ";"
    link(";", "Ada>>")
    model.embed[...] = jnp.asarray(emb)
    model.lm_head.kernel[...] = jnp.asarray(W)
    for block in [model.layers] if model.cfg.scan_layers else model.layers:  # scanned: all layers at once
        block.attn.o.kernel[...] = block.attn.o.kernel[...] * 0.05
        block.mlp.down.kernel[...] = block.mlp.down.kernel[...] * 0.05
    return model, tok


class _Result:
    def __init__(self, entities):
        self.entities, self.too_large, self.scores = entities, False, [1.0] * len(entities)


class DictMemory:
    """Exact-match memory (the memory's own speed is benchmarked by `memllm bench memory`)."""

    def __init__(self, facts):
        self.facts = facts

    def query(self, queries):
        return [_Result(list(self.facts.get((q.subject, q.relation, q.object), []))) for q in queries]


class ListMemory:
    """Records the added triples (the memory's own speed is benchmarked by `memllm bench memory`)."""

    def __init__(self):
        self.added = []

    def add(self, triples, source):
        self.added += [(str(t), source) for t in triples]


def torch_original(hf_model, tok, memory, prompt_ids, max_new_tokens):
    """The original algorithm: HF generate at batch 1, stop at `)-->` / a new `({MEM_READ(`, run the
    memory, edit the context, re-encode it all with the next `generate` call."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    open_id, end_id = tok.marker_id[protocol.MEM_READ], tok.marker_id[protocol.READ_END]
    close_id = tok.marker_id[protocol.CALL_END]

    class Stop(StoppingCriteria):
        def __init__(self, stop_on_open):
            self.stop_ids = {end_id} | ({open_id} if stop_on_open else set())

        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([int(input_ids[0, -1]) in self.stop_ids])

    ctx, n_prompt, generated = list(prompt_ids), len(prompt_ids), 0
    active, call_start = None, None
    while generated < max_new_tokens:
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ctx]), attention_mask=torch.ones(1, len(ctx), dtype=torch.long),
                                    max_new_tokens=max_new_tokens - generated, do_sample=False,
                                    stopping_criteria=StoppingCriteriaList([Stop(active is not None)]),
                                    pad_token_id=tok.eos_id, eos_token_id=tok.eos_id)
        new = out[0, len(ctx):].tolist()
        generated += len(new)
        ctx += new
        if not new or new[-1] == tok.eos_id:
            break
        if new[-1] == open_id and active is not None:
            s, e = active
            ctx, active = ctx[:s] + ctx[e:], None
            call_start = len(ctx) - 1
        elif new[-1] == end_id:
            call_start = max(i for i, t in enumerate(ctx) if t == open_id)
            parsed = protocol.parse_read_call(tok.decode(ctx[call_start:]))
            ents = [e for r in memory.query(list(parsed.items)) for e in r.entities] if parsed.ok else []
            if ents:
                ctx += tok.encode(protocol.format_read_result(ents))
                active = (call_start, len(ctx))
            else:
                ctx = ctx[:call_start]
    del close_id
    return ctx[n_prompt:], generated


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--preset", default=None,
                        help="take the model's shape from a preset (memllm_jax.config.PRESETS, e.g. smollm2_135m: "
                             "its layers, widths, heads and vocabulary) instead of --d-model / --layers")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=None,
                        help="sentences in each write corpus (default 4 x --batch: refilling a pool needs more "
                             "sentences than rows)")
    parser.add_argument("--part", choices=("all", "read", "write"), default="all")
    parser.add_argument("--reads", choices=("host", "in_loop", "both"), default="host",
                        help="how our read contenders serve memory reads: at loop exits by the host (default), from "
                             "inside the jitted loop (decode.reader module docstring), or both side by side")
    parser.add_argument("--matmul-sizes", default="512,1024,2048",
                        help="sides of the square matmuls of the ceiling (the write part's roofline)")
    parser.add_argument("--matmul-dtype", choices=("float32", "bfloat16"), default=None,
                        help="our model's matmul operand dtype (ModelConfig.matmul_dtype; default float32); the "
                             "torch original stays float32")


def model_shape(args: argparse.Namespace) -> dict:
    """ModelConfig fields of the benchmarked model: a preset's shape, or a small Mistral of --d-model / --layers;
    with --matmul-dtype."""
    precision = {"matmul_dtype": args.matmul_dtype} if getattr(args, "matmul_dtype", None) else {}
    return {**_shape(args), **precision}


def _shape(args: argparse.Namespace) -> dict:
    if args.preset:
        from memllm_jax.config import PRESETS

        p = PRESETS[args.preset]
        return dict(d_model=p.d_model, n_layers=p.n_layers, n_heads=p.n_heads, n_kv_heads=p.n_kv_heads,
                    head_dim=p.head_dim, d_ff=p.d_ff, rope_theta=p.rope_theta, norm_eps=p.norm_eps,
                    vocab_size=p.vocab_size, max_seq_len=1024)
    D = args.d_model
    return dict(d_model=D, n_layers=args.layers, n_heads=8, n_kv_heads=4, head_dim=D // 8, d_ff=3 * D,
                max_seq_len=1024)


def _key(batch: int, reads: str) -> str:
    return f"ours_b{batch}" + ("" if reads == "host" else f"_{reads}")


def _label(batch: int, reads: str, both: bool) -> str:
    return f"ours batch {batch}" + (f" ({reads.replace('_', '-')} reads)" if both or reads != "host" else "")


def main(args: argparse.Namespace) -> int:
    import torch
    from transformers import MistralForCausalLM

    from memllm_jax.bench.timing import interleaved, markdown_table
    from memllm_jax.decode.reader import generate_with_memory
    from memllm_jax.decode.refill import refill_writes
    from memllm_jax.decode.corpus_writer import iter_write_prompts, write_corpus, WriteDocument
    from memllm_jax.decode.writer import WriteDecoding, decode_writes
    from memllm_jax.model.hf import save_hf

    model, tok = build(model_shape(args))
    D, n_layers = model.cfg.d_model, model.cfg.n_layers
    memory = DictMemory({("Rome", "capital of", None): ["Italy"]})
    with tempfile.TemporaryDirectory() as d:
        save_hf(model, d)
        hf_model = MistralForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    prompts = [[tok.bos_id] + tok.encode("x" * (i % 5) + "".join(WORDS[j] for j in range(i % 14 + 1)))
               for i in range(args.batch)]
    N = args.max_new_tokens
    counts = {}

    def ours(batch, reads="host"):
        def run():
            res = generate_with_memory(model, tok, memory, prompts[:batch], N, batch_size=batch, chunk=32, reads=reads)
            counts[_key(batch, reads)] = (sum(r.n_generated for r in res), res)
        return run

    def original():
        total, outs = 0, []
        for p in prompts[:1]:
            ids, n = torch_original(hf_model, tok, memory, p, N)
            total += n
            outs.append(ids)
        counts["original"] = (total, outs)

    # (b) writes, two corpora. "documents": Re-DocRED-sized documents (8 sentences, its mean) with the
    # default pretext window (10 sentences), written with `write_corpus` (the memory stage's call) at batch
    # 16 and at batch 1; one document's prompts share their pretext, which the batched path prefills once
    # (shown with and without that). "sliding": one long document with a 2-sentence pretext window, so no
    # two prompts share more than BOS: batching alone.
    def sentence(i):
        return f"Ada was born in London in year {1800 + i}." + " more" * (i % 4)

    n_sentences = args.sentences or 4 * args.batch
    n_docs = max(1, n_sentences // 8)
    docs = [WriteDocument.from_sentences(f"doc{k}", [sentence(8 * k + i) for i in range(8)]) for k in range(n_docs)]
    n_doc_sents = 8 * n_docs
    sliding = WriteDocument.from_sentences("d", [sentence(i) for i in range(n_sentences)])
    write_prompts = [ids for _, ids in iter_write_prompts(sliding, tok, pretext_sentences=2)]
    decoding = WriteDecoding(max_new_tokens=WRITE_NEW_TOKENS)

    def corpus(batch, share=True, key=None, refill=False):
        def run():
            mem = ListMemory()
            write_corpus(model, tok, mem, docs, decoding, batch_size=batch, share_prefixes=share,
                         refill=refill)
            counts[key] = mem.added
        return run

    def writes_batched():  # consecutive batches of --batch prompts
        counts["w_batched"] = [o for s in range(0, len(write_prompts), args.batch)
                               for o in decode_writes(model, tok, write_prompts[s:s + args.batch],
                                                      decoding, pad_to=args.batch)]

    def writes_refilled():
        counts["w_refilled"] = refill_writes(model, tok, write_prompts, decoding, pool=args.batch)

    def writes_sequential():
        counts["w_seq"] = [decode_writes(model, tok, [p], decoding)[0] for p in write_prompts]

    rows, notes = [], []
    if args.part != "write":
        modes = ("host", "in_loop") if args.reads == "both" else (args.reads,)
        ours_runs = {_label(b, m, len(modes) > 1): (_key(b, m), ours(b, m)) for b in (1, args.batch) for m in modes}
        t = interleaved({**{name: run for name, (_, run) in ours_runs.items()}, "original (torch)": original},
                        repeats=args.repeats)
        same = all(counts[_key(1, m)][1][0].token_ids == counts["original"][1][0] for m in modes)
        same_modes = len(modes) == 1 or ([r.token_ids for r in counts[_key(args.batch, "host")][1]]
                                         == [r.token_ids for r in counts[_key(args.batch, "in_loop")][1]])
        calls = counts[_key(args.batch, modes[0])][1][0].calls
        base = counts["original"][0] / t["original (torch)"].median
        for name, key in [("original (torch)", "original")] + [(n, k) for n, (k, _) in ours_runs.items()]:
            tps = counts[key][0] / t[name].median
            rows.append([f"read: {name}", f"{tps:,.0f} tokens/s", f"±{t[name].spread:.0%}", f"{tps / base:.1f}x"])
        notes.append(f"model: {args.preset or 'custom'} shape, d_model={D}, layers={n_layers}, vocabulary "
                     f"{model.cfg.vocab_size:,} (untied head); {N} new tokens per sequence; calls per sequence "
                     f"(ours b{args.batch}, row 0): {len(calls)}; ours == original tokens: {same}; reads: {args.reads}"
                     + ("" if len(modes) == 1 else f"; in-loop == host tokens: {same_modes}"))
    if args.part == "read":
        print("\n".join(notes))
        print(markdown_table(["contender", "throughput", "spread", "vs baseline"], rows))
        return 0
    from memllm_jax.bench import ceiling

    ceil = ceiling.measure(ceiling.model_dtypes(model.cfg),
                           [int(x) for x in args.matmul_sizes.split(",")])
    w = interleaved({"docs batched": corpus(args.batch, True, "d_b"), "docs batched, no sharing": corpus(args.batch, False, "d_bn"),
                     "docs batched, refilled": corpus(args.batch, True, "d_r", refill=True),
                     "docs sequential": corpus(1, True, "d_s"), "writes batched": writes_batched,
                     "writes batched, refilled": writes_refilled, "writes sequential": writes_sequential},
                    repeats=args.repeats)

    doc_prompts = [ids for d in docs for _, ids in iter_write_prompts(d, tok)]
    doc_outs = [decode_writes(model, tok, [p], decoding)[0] for p in doc_prompts]
    useful, executed = write_flops(model.cfg, args.batch, doc_prompts, doc_outs, write_prompts, counts["w_seq"])

    def of_ceiling(name, flops):
        return f"{100 * flops.total / w[name].median / ceil.flops:.3g}%"

    def roof(name, corpus_name):
        return [of_ceiling(name, useful[corpus_name]), of_ceiling(name, executed[name])]

    for label, n, (seq, *others) in (
            ("documents", n_doc_sents, ("docs sequential", "docs batched, no sharing", "docs batched",
                                        "docs batched, refilled")),
            ("sliding", len(write_prompts), ("writes sequential", "writes batched", "writes batched, refilled"))):
        ws = n / w[seq].median
        rows.append([f"write {label}: one sentence at a time", f"{ws:,.1f} sentences/s", f"±{w[seq].spread:.0%}",
                     "1.0x", *roof(seq, label)])
        for name in others:
            wb = n / w[name].median
            desc = name.replace("docs ", "").replace("writes ", "").replace("batched", f"batched ({args.batch})")
            rows.append([f"write {label}: {desc}", f"{wb:,.1f} sentences/s", f"±{w[name].spread:.0%}",
                         f"{wb / ws:.1f}x", *roof(name, label)])
    same_w = ([o["ids"] for o in counts["w_batched"]] == [o["ids"] for o in counts["w_refilled"]]
              == [o["ids"] for o in counts["w_seq"]]
              and counts["d_b"] == counts["d_s"] == counts["d_bn"] == counts["d_r"] and bool(counts["d_s"]))
    prompt_lens = [len(ids) for ids in doc_prompts]
    notes.append(f"write corpora: documents = {n_docs} x 8 sentences, pretext window 10, prompts "
                 f"{min(prompt_lens)}-{max(prompt_lens)} tokens; sliding = 1 x {len(write_prompts)} sentences, "
                 f"pretext window 2, prompts {min(map(len, write_prompts))}-{max(map(len, write_prompts))} tokens")
    notes.append(f"batched and refilled writes == sequential (tokens, and triples added): {same_w}; "
                 f"mean write cut points: {np.mean([o['n_cuts'] for o in counts['w_batched']]):.1f}")
    notes.append(f"write roofline: {ceil.describe()}; useful GFLOP (prefill + decode): " + ", ".join(
        f"{k} {f.prefill / 1e9:.3g} + {f.decode / 1e9:.3g}" for k, f in useful.items())
        + "; of roofline = useful FLOP/s / ceiling; executed = FLOPs computed, padding and idle rows included "
        "(bench.roofline)")
    print("\n".join(notes))
    header = ["contender", "throughput", "spread", "vs baseline", "of roofline", "executed / ceiling"]
    print(markdown_table(header, [r + ["-"] * (len(header) - len(r)) for r in rows]))
    return 0


def write_flops(cfg, batch: int, doc_prompts, doc_outs, sliding_prompts, sliding_outs):
    """Useful FLOPs of each write corpus, and executed FLOPs of each write contender (`bench.roofline`; refilled
    pools at the default `refill_at`), from the prompts and each prompt's one-at-a-time outputs (the same tokens as
    batched, checked by the bench)."""
    from memllm_jax.bench import roofline as R
    from memllm_jax.decode.state import STATUS_NAMES, STOPPED

    def fed(outs):  # tokens fed back, and whether the row stopped at a cut (one more loop step)
        return [o["n_generated"] for o in outs], [o["stop"] == STATUS_NAMES[STOPPED] for o in outs]

    docs, sliding = (doc_prompts, *fed(doc_outs)), (sliding_prompts, *fed(sliding_outs))
    kw = dict(max_new_tokens=WRITE_NEW_TOKENS)
    useful = {"documents": R.useful_write_flops(cfg, *docs[:2]), "sliding": R.useful_write_flops(cfg, *sliding[:2])}
    executed = {
        "docs batched": R.executed_corpus_flops(cfg, *docs, batch_size=batch, **kw),
        "docs batched, no sharing": R.executed_corpus_flops(cfg, *docs, batch_size=batch, share_prefixes=False, **kw),
        "docs batched, refilled": R.executed_refill_flops(cfg, *docs, pool=batch, **kw),
        "docs sequential": R.executed_corpus_flops(cfg, *docs, batch_size=1, **kw),
        "writes batched": R.executed_corpus_flops(cfg, *sliding, batch_size=batch, **kw),
        "writes batched, refilled": R.executed_refill_flops(cfg, *sliding, pool=batch, **kw),
        "writes sequential": R.executed_corpus_flops(cfg, *sliding, batch_size=1, **kw),
    }
    return useful, executed
