"""`memllm generate`: continue prompts with memory reads.

    memllm generate --model DIR [--memory MEMDIR] "prompt one" "prompt two" [--show-memory]
    memllm generate --model DIR --prompts-file prompts.txt   (one prompt per line)
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Sequence

from memllm_jax import options, protocol
from memllm_jax.html import esc, table, write_page


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompts", nargs="*", help="prompt texts")
    parser.add_argument("--model", required=True, type=pathlib.Path, help="model checkpoint, training workdir, HF directory or FILE.gguf")
    parser.add_argument("--tokenizer", type=pathlib.Path, help="tokenizer (default: the one stored with the model)")
    parser.add_argument("--memory", type=pathlib.Path, help="memory directory (default: no memory)")
    parser.add_argument("--prompts-file", type=pathlib.Path, help="one prompt per line")
    parser.add_argument("--max-new-tokens", type=options.positive_int, default=64, help="tokens generated per prompt")
    parser.add_argument("--temperature", type=options.nonnegative_float, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=options.nonnegative_int, default=0, help="sample from the k most likely tokens (0: all)")
    parser.add_argument("--top-p", type=options.top_p, default=1.0, help="sample from the most likely tokens of this total probability (1: all)")
    parser.add_argument("--seed", type=options.nonnegative_int, default=0, help="sampling seed")
    parser.add_argument("--batch-size", type=options.positive_int, default=16, help="prompts decoded together")
    parser.add_argument("--force-read", action="store_true", help="open a memory read right after each prompt")
    parser.add_argument("--show-memory", action="store_true", help="print every API call, its queries and result")
    parser.add_argument("--html", type=pathlib.Path, metavar="FILE",
                        help="also write the results with every memory call as a self-contained HTML page")


def format_result(prompt: str, res, show_memory: bool) -> str:
    lines = [f"{prompt}{res.plain_text}"]
    if show_memory:
        lines.append(f"  raw: {res.text!r}  (finish: {res.finish_reason})")
        for k, call in enumerate(res.calls):
            queries = "; ".join(f"<{q.subject or '*'}, {q.relation}, {q.object or '*'}>" for q in call.queries)
            status = f"removed ({call.reason})" if call.removed else "kept"
            extra = " [repeated: answered from the earlier call]" if call.repeated else ""
            lines.append(f"  call {k}: {call.query_text!r}")
            lines.append(f"    queries: {queries or '-'}  errors: {'; '.join(call.errors) or '-'}")
            lines.append(f"    result: {list(call.result)}  -> {status}{extra}")
    return "\n".join(lines)


def generation_view(prompt: str, res) -> str:
    """One `memllm generate` result (`decode.reader.GenerationResult`): the continuation with every call still
    in its context shown inline (queries, results), and every call in a table with its fate. Calls that were
    removed are not in the final text, so they are listed in order without a position; losses are not
    computed while generating, so tokens are not shaded."""
    kept = iter([c for c in res.calls if not c.removed])
    parts, text, i = [], res.text, 0
    while True:
        k = text.find(protocol.MEM_READ, i)
        if k < 0:
            parts.append(esc(protocol.unescape_text(text[i:])))
            break
        end = text.find(protocol.CALL_END, k)
        end = len(text) if end < 0 else end + len(protocol.CALL_END)
        parts.append(esc(protocol.unescape_text(text[i:k])))
        call = next(kept, None)
        res_txt = ", ".join(call.result) if call is not None and call.result else "∅"
        parts.append(f"<span class=\"call used\" title=\"{esc(text[k:end])}\">{esc(text[k:end])} "
                     f"<span class=\"res\">→ {esc(res_txt)}</span></span>")
        i = end
    rows = [(n, c.query_text, "; ".join(f"<{q.subject or '*'}, {q.relation}, {q.object or '*'}>" for q in c.queries)
             or "–", ", ".join(c.result) or "∅", f"removed: {c.reason}" if c.removed else "kept in context",
             "yes" if c.repeated else "no", "; ".join(c.errors) or "–") for n, c in enumerate(res.calls)]
    calls = table(["call", "text", "queries", "results", "fate", "repeated", "errors"], rows) if rows else \
        "<p class=\"note\">no memory calls</p>"
    return (f"<div class=\"doc-trace\"><h3>{esc(prompt)}</h3><p class=\"note\">finish: {esc(res.finish_reason)}, "
            f"{res.n_generated} tokens generated, {len(res.calls)} calls ({sum(c.removed for c in res.calls)} removed)"
            f"</p><div class=\"trace\"><b>{esc(prompt)}</b>{''.join(parts)}</div>{calls}</div>")


def generation_page(path: str | os.PathLike, prompts: Sequence[str], results: Sequence) -> pathlib.Path:
    body = ("<h1>memllm generate</h1><p class=\"note\">The prompt in bold, then the model's text; memory calls "
            "still in the context are shown where they stand, with their results.</p>"
            + "".join(generation_view(p, r) for p, r in zip(prompts, results)))
    return write_page(path, "memllm generate", body)


def main(args: argparse.Namespace) -> int:
    from memllm_jax.errors import InputError, read_text

    prompts = list(args.prompts)
    if args.prompts_file:
        prompts += [line for line in read_text(args.prompts_file).splitlines() if line.strip()]
        if not prompts:
            raise InputError(f"{args.prompts_file}: no prompts (every line is empty)")
    if not prompts:
        raise InputError("memllm generate: give prompts or --prompts-file")
    from memllm_jax.decode.io import NoMemory, check_memory, open_memory
    from memllm_jax.files import check_writable
    from memllm_jax.model.load import load

    if args.memory:  # inputs and outputs first: the model takes a while to load
        check_memory(args.memory, create=False)
    if args.html:
        check_writable(args.html)

    model, tok = load(args.model, tokenizer=args.tokenizer, need_tokenizer=True)
    from memllm_jax.decode.reader import generate_with_memory
    from memllm_jax.decode.sampling import SamplingConfig

    memory = open_memory(args.memory, create=False) if args.memory else NoMemory()
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    results = generate_with_memory(model, tok, memory, prompts, args.max_new_tokens, sampling=sampling,
                                   batch_size=args.batch_size, force_read=args.force_read, seed=args.seed)
    for prompt, res in zip(prompts, results):
        print(format_result(prompt, res, args.show_memory))
    if args.html:
        print(f"wrote {generation_page(args.html, prompts, results)}", file=sys.stderr)
    return 0
