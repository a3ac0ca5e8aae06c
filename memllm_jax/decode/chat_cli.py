"""`memllm chat`: an interactive session over a persistent memory, in the spirit of RET-LLM's controller.

A line ending with "?" is a question: it is answered by generation with memory reads. Any other line is a
statement: its sentences go through the memory-write model and the extracted triples are stored (and
printed). The memory directory is saved after every change, so it persists between sessions. Commands:

    /show ENTITY             triples about an entity
    /list                    every stored triple with its provenance
    /delete S>>r>>O          delete one triple;  /forget ENTITY  delete every triple of an entity
    /help, /quit
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys
from typing import Iterable, TextIO

from memllm_jax import options, protocol

HELP = __doc__.split("Commands:")[1]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=pathlib.Path, help="read model: model checkpoint, training workdir, HF directory or FILE.gguf")
    parser.add_argument("--write-model", type=pathlib.Path, help="write model (default: --model)")
    parser.add_argument("--tokenizer", type=pathlib.Path, help="tokenizer (default: the one stored with the model)")
    parser.add_argument("--memory", required=True, type=pathlib.Path, help="memory directory (created if absent)")
    parser.add_argument("--encoder", default="minilm", help="encoder of a new memory")
    parser.add_argument("--max-new-tokens", type=options.positive_int, default=48, help="tokens generated per answer")
    parser.add_argument("--force-read", action="store_true", help="open a memory read right after each question")
    parser.add_argument("--show-memory", action="store_true", help="print each API call of an answer")
    parser.add_argument("--keep-empty", action="store_true",
                        help="keep a read that finds nothing in the context, closed with nothing, so that a model "
                             f"trained for it answers {protocol.ABSTAIN!r} (memory-aware; the paper removes it)")
    parser.add_argument("--keep-reads", action="store_true",
                        help="keep a complete read in the context when the next one opens, so that a model trained "
                             "for it chains two reads for a two-hop question (the paper removes it)")


def chat_session(read_model, write_model, tok, memory, lines: Iterable[str], out: TextIO, *, save=None,
                 max_new_tokens: int = 48, force_read: bool = False, show_memory: bool = False,
                 session: str = "chat", keep_empty: bool = False, keep_reads: bool = False) -> None:
    """Run the chat over `lines` (stdin or a test script), writing replies to `out`; `save()` persists."""
    from memllm_jax.decode.generate_cli import format_result
    from memllm_jax.decode.reader import generate_with_memory
    from memllm_jax.decode.corpus_writer import write_corpus, WriteDocument
    from memllm_jax.decode.write_cli import _SENT_END

    history: list[str] = []
    save = save or (lambda: None)
    it = iter(lines)
    for n in itertools.count():
        out.write("> ")
        out.flush()
        line = next(it, None)
        if line is None:
            break
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            cmd, _, arg = line.partition(" ")
            arg = arg.strip()
            if cmd == "/quit":
                break
            if cmd == "/show":
                triples = memory.show(arg)
                out.write("".join(f"  {protocol.format_triple(t)}\n" for t in triples) or f"  nothing about {arg!r}\n")
            elif cmd == "/list":
                recs = memory.records()
                out.write("".join(f"  {r['subject']}>>{r['relation']}>>{r['object']}  ({r['source']})\n" for r in recs)
                          or "  the memory is empty\n")
            elif cmd == "/delete":
                parsed = protocol.parse_triples(arg)
                if parsed.errors or len(parsed.items) != 1:
                    out.write(f"  expected one triple S>>r>>O: {'; '.join(parsed.errors)}\n")
                    continue
                out.write(f"  deleted {memory.delete_triples(parsed.items)} triple(s)\n")
                save()
            elif cmd == "/forget":
                out.write(f"  deleted {memory.delete_entity(arg)} triple(s)\n")
                save()
            else:
                out.write(HELP)
            continue
        if line.endswith("?"):
            [res] = generate_with_memory(read_model, tok, memory, [line + " "], max_new_tokens,
                                         force_read=force_read, keep_empty=keep_empty, keep_reads=keep_reads)
            out.write(format_result("", res, show_memory) + "\n")
            continue
        sentences = [s for s in _SENT_END.split(line) if s]
        pretext = history[-10:]
        doc = WriteDocument.from_sentences(f"{session}/{n}", pretext + sentences, first_focus=len(pretext))
        written: list[protocol.Triple] = []

        class Recorder:
            def add(self, triples, source="", replace=False):
                written.extend(triples)
                return memory.add(triples, source=source, replace=replace)

        write_corpus(write_model, tok, Recorder(), [doc], batch_size=max(1, len(sentences)))
        history += sentences
        out.write("".join(f"  stored {protocol.format_triple(t)}\n" for t in written) or "  (nothing to store)\n")
        if written:
            save()


def main(args: argparse.Namespace) -> int:
    from memllm_jax.decode.io import check_memory, open_memory
    from memllm_jax.model.load import load

    check_memory(args.memory, args.encoder)  # before the models load
    read_model, tok = load(args.model, tokenizer=args.tokenizer, need_tokenizer=True)
    write_model = load(args.write_model, tokenizer=tok)[0] if args.write_model else read_model
    memory = open_memory(args.memory, args.encoder)

    def save():
        args.memory.mkdir(parents=True, exist_ok=True)
        memory.save(args.memory)

    print("memllm chat: statements are stored, questions (ending with ?) are answered; /help for commands")
    chat_session(read_model, write_model, tok, memory, sys.stdin, sys.stdout, save=save,
                 max_new_tokens=args.max_new_tokens, force_read=args.force_read, show_memory=args.show_memory,
                 keep_empty=args.keep_empty, keep_reads=args.keep_reads)
    save()
    return 0
