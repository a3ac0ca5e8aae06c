"""`memllm data synth|build|filter`: synthesize corpora, build write / read / eval examples, filter relations."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from memllm_jax import protocol
from memllm_jax.docred import DEFAULT_REL_INFO, load_relation_labels
from memllm_jax.errors import InputError

MEMLLM_LABELS = DEFAULT_REL_INFO.parent / "rel_labels_memllm.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True)
    s = sub.add_parser("synth", help="write a synthetic DocRED-format corpus (and its rel_info.json)")
    s.add_argument("--out", required=True,
                   help="output .json (a DocRED array) or .jsonl; the relation labels go to rel_info.json beside it, "
                        "which is refused when a different rel_info.json is already there")
    s.add_argument("--docs", type=int, default=1000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--persons", type=int, default=None, help="world size (default docs // 2, in [40, 50000])")
    s.add_argument("--style", choices=("docred", "retllm"), default="docred")
    s.add_argument("--phrases", action="store_true",
                   help="also state facts of the 30 relations outside DocRED's labels, named by a phrase of the "
                        "sentence (data_gen/synth_world.py PHRASE_RELATIONS; their labels go to rel_info.json)")

    b = sub.add_parser("build", help="build write / read / eval examples from a DocRED-format corpus")
    b.add_argument("--input", required=True, help="DocRED-format .json array or .jsonl")
    b.add_argument("--out", required=True,
                   help="output directory (an earlier build's example files there are replaced or removed)")
    b.add_argument("--kinds", default="write,read,eval", help="comma list of write, read, eval, lm")
    b.add_argument("--labels", default=None,
                   help="relation labels: a JSON file, 'docred' (rel_info.json) or 'memllm' (rel_labels_memllm.json); "
                        "default: rel_info.json beside the input, else the corpus's ids if the bundled synthetic table knows them")
    b.add_argument("--memory", default="gold",
                   help="'gold' (exact lookup of the corpus's gold triples) or a TripleMemory directory "
                        "(created and filled with the gold triples when it does not exist)")
    b.add_argument("--encoder", default="minilm", help="entity/relation encoder for --memory DIR (minilm, hash:DIM, dir)")
    b.add_argument("--pretext-sentences", type=int, default=10, help="write-example pretext window (sentences)")
    b.add_argument("--q-thr", type=int, default=30)
    b.add_argument("--max-queries", type=int, default=3)
    b.add_argument("--no-ambiguous-filter", action="store_true", help="keep Table 4's ambiguous queries")
    b.add_argument("--counterfactual", type=int, default=0, help="also build N counterfactual variants (§4.1) of the write and read examples")
    b.add_argument("--context-free", type=int, default=0,
                   help="also N write examples per document of one later sentence without its pretext")
    b.add_argument("--lone-phrases", type=int, default=0,
                   help="also up to N write examples per document of a sentence stating a phrase-relation fact, "
                        "without its pretext")
    b.add_argument("--write-evidence", action="store_true",
                   help="a write example's targets are only the triples its sentence is evidence for (annotated, or "
                        "naming both entities when a relation has no annotation), as the paper builds them")
    b.add_argument("--read-context-free", type=int, default=0,
                   help="also the read examples of N later sentences per document, each without the text before it")
    b.add_argument("--question-form", type=int, default=0,
                   help="also N write examples per document of one triple asked as a question and answered "
                        "(the form of Table 3's edits)")
    b.add_argument("--read-question-form", type=int, default=0,
                   help="also N read examples per document of one triple asked as a question, read and answered")
    b.add_argument("--read-absent-questions", type=int, default=0,
                   help="also N read examples per document of a question about a fact the memory does not hold, its "
                        f"empty read and the answer {protocol.ABSTAIN!r} (memory-aware reading)")
    b.add_argument("--read-absent-form", choices=("question", "cloze", "mixed"), default="question",
                   help="ask the absent-fact examples as questions, as the synthetic corpus's sentence starts (cloze), "
                        "or either at random")
    b.add_argument("--read-two-hop", type=int, default=0,
                   help="also N read examples per document of a two-hop question over two of its triples, answered "
                        "by two reads (a composite relation)")
    b.add_argument("--read-two-hop-distractors", type=float, default=0.0,
                   help="share of the two-hop reads whose results also hold other objects of the subject after the "
                        "right one, as the memory's relation matching returns them")
    b.add_argument("--read-keep-reads", action="store_true",
                   help="for a reader decoded with its complete reads kept in the context: each two-hop question as "
                        "one example holding both reads")
    b.add_argument("--misread-rate", type=float, default=0.0,
                   help="replace this share of the read examples' query results by another entity the text named "
                        "before the read (an imperfect memory, as the paper's training reads see)")
    b.add_argument("--format", choices=("jsonl", "arrayrecord"), default="jsonl")
    b.add_argument("--limit", type=int, default=None, help="only the first N documents")
    b.add_argument("--seed", type=int, default=0)

    f = sub.add_parser("filter", help="distant-supervision filter (§4.1.1, Figure 5 prompt)")
    f.add_argument("--input", required=True)
    f.add_argument("--labels", default=None)
    f.add_argument("--prompts", default=None, help="write the candidate prompts to this JSONL and stop")
    f.add_argument("--answers", default=None, help="JSONL of completions ({'completion': str}) in --prompts order")
    f.add_argument("--model", default=None, help="an HF model directory to generate the answers with")
    f.add_argument("--max-new-tokens", type=int, default=96)
    f.add_argument("--score", type=int, default=0, help="score on a balanced set of N positives + N negatives (Table 1)")
    f.add_argument("--only-missing-evidence", action="store_true", help="judge only relations without evidence")
    f.add_argument("--out", default=None, help="filtered corpus (.json) to write")
    f.add_argument("--decisions", default=None,
                   help="JSONL with one record per candidate: its relation, gold, decision (yes / no / unparsed) "
                        "and the completion")
    f.add_argument("--batch-size", type=int, default=8, help="prompts generated together with --model")
    f.add_argument("--seed", type=int, default=0)


def labels_for(spec: str | None, input_path: str) -> dict[str, str]:
    """`--labels`: a file, or 'docred' / 'memllm' (the shared DocRED label files). Without it: rel_info.json
    beside the input (as `memllm data synth` writes it), else the corpus's own relation ids when the bundled
    synthetic label table knows them all, else an error asking for `--labels FILE`."""
    if spec in ("docred", "memllm"):
        path = DEFAULT_REL_INFO if spec == "docred" else MEMLLM_LABELS
        if not path.is_file():
            raise InputError(f"--labels {spec}: {path} is not on this machine; pass --labels FILE "
                             "(a JSON object mapping relation ids to labels, e.g. DocRED's rel_info.json)")
        return load_relation_labels(path)
    if spec:
        return load_relation_labels(spec)
    beside = pathlib.Path(input_path).parent / "rel_info.json"
    if beside.exists():
        return load_relation_labels(beside)
    return _corpus_labels(input_path)


def _corpus_labels(input_path: str) -> dict[str, str]:
    """The bundled synthetic label table, when it names every relation id the corpus uses."""
    from data_gen.io import iter_json_array
    from data_gen.synth_world import is_phrase_id
    from data_gen.synthetic import synthetic_rel_info

    used = {lab["r"] for doc in iter_json_array(input_path) if isinstance(doc, dict) and isinstance(doc.get("labels"), list)
            for lab in doc["labels"] if isinstance(lab, dict) and isinstance(lab.get("r"), str)}
    known = synthetic_rel_info(phrases=any(is_phrase_id(r) for r in used))
    unknown = sorted(used - known.keys())
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise InputError(f"{input_path}: relation ids {shown} have no label here (no rel_info.json beside the corpus, "
                         "not in the bundled synthetic table); pass --labels FILE (a JSON object mapping relation ids "
                         "to labels, e.g. DocRED's rel_info.json)")
    return known


def main(args: argparse.Namespace) -> int:
    return {"synth": _synth, "build": _build, "filter": _filter}[args.data_command](args)


def _synth(args) -> int:
    from data_gen.io import JsonArrayWriter, JsonlWriter
    from memllm_jax.files import atomic_open
    from data_gen.synth_world import PHRASE_RELATIONS
    from data_gen.synthetic import iter_synthetic, synthetic_rel_info

    if args.docs < 1:
        raise InputError(f"--docs {args.docs}: a corpus needs at least one document")
    t0 = time.perf_counter()
    out = pathlib.Path(args.out)
    rel_info = out.parent / "rel_info.json"
    labels = synthetic_rel_info(phrases=args.phrases)
    if rel_info.exists() and _json_or_none(rel_info) != labels:  # e.g. DocRED's labels
        raise InputError(f"{rel_info}: a different relation label file is already there (the synthetic corpus "
                         f"writes its own rel_info.json beside --out); choose another folder or remove it")
    n_sent = n_rel = n_pron = 0
    writer = JsonlWriter(out) if out.suffix == ".jsonl" else JsonArrayWriter(out)
    with writer as w:
        phrases = tuple(PHRASE_RELATIONS) if args.phrases else ()
        for doc in iter_synthetic(args.docs, args.seed, args.persons, args.style, phrases=phrases):
            w.write(doc)
            n_sent += len(doc["sents"])
            n_rel += len(doc["labels"])
            n_pron += sum(m["name"].lower() in ("he", "she", "it", "his", "her", "its") for e in doc["vertexSet"] for m in e)
    wrote = f"{out}" if rel_info.exists() else f"{out} and {rel_info}"  # an equal rel_info.json stays as it is
    if not rel_info.exists():
        with atomic_open(rel_info) as f:
            json.dump(labels, f, indent=1)
    dt = time.perf_counter() - t0
    print(f"## synthetic corpus ({args.style}, seed {args.seed})\n\n| statistic | value |\n|---|---|\n"
          f"| documents | {args.docs} |\n| sentences per document | {n_sent / max(args.docs, 1):.2f} |\n"
          f"| relations per document | {n_rel / max(args.docs, 1):.2f} |\n| pronoun mentions | {n_pron} |\n"
          f"| relation types | {len(labels)} |\n| seconds | {dt:.2f} |\n\nwrote {wrote}")
    return 0


def _json_or_none(path: pathlib.Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _query_fn(args, docs_iter_factory, labels):
    from data_gen.gold_memory import GoldLookup, fill_memory, memory_query_fn

    if args.memory == "gold":
        return GoldLookup().add_documents(docs_iter_factory())
    from memllm_jax.memory import TripleMemory, load_encoder

    enc = load_encoder(args.encoder)
    mem_dir = pathlib.Path(args.memory)
    if mem_dir.exists():
        mem = TripleMemory.open(mem_dir, enc)
    else:
        mem = TripleMemory(enc)
        n = fill_memory(mem, docs_iter_factory())
        mem.save(mem_dir)
        print(f"filled a new memory at {mem_dir} with {n} gold triples", file=sys.stderr)
    return memory_query_fn(mem)


def _build(args) -> int:
    from data_gen import build
    from data_gen.recipes import ReadRecipe, WriteRecipe
    from memllm_jax.settings import check_tree

    labels = labels_for(args.labels, args.input)
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    bad = kinds - set(build.KINDS)
    if bad:
        raise SystemExit(f"--kinds: unknown kind(s) {sorted(bad)}")
    write = WriteRecipe(pretext_sentences=args.pretext_sentences, context_free=args.context_free,
                        lone_phrases=args.lone_phrases, question_form=args.question_form, evidence=args.write_evidence,
                        counterfactual=args.counterfactual)
    read = ReadRecipe(q_thr=args.q_thr, max_queries=args.max_queries, filter_ambiguous=not args.no_ambiguous_filter,
                      context_free=args.read_context_free, question_form=args.read_question_form,
                      absent_questions=args.read_absent_questions, absent_form=args.read_absent_form,
                      two_hop=args.read_two_hop, two_hop_distractors=args.read_two_hop_distractors,
                      keep_reads=args.read_keep_reads,
                      misread_rate=args.misread_rate, counterfactual=args.counterfactual)
    check_tree(write)
    check_tree(read)
    stats = build.build_all(args.input, args.out, labels, kinds=kinds, write=write, read=read,
                            query_fn_factory=lambda factory: _query_fn(args, factory, labels),
                            fmt=args.format, limit=args.limit, seed=args.seed)
    print(stats.report(f"examples from {args.input}"))
    return 0


def _filter(args) -> int:
    from data_gen import distant_filter as DF
    from data_gen.io import JsonArrayWriter, iter_json_array, read_jsonl, write_jsonl

    labels = labels_for(args.labels, args.input)
    docs = list(iter_json_array(args.input))
    if not docs:
        raise InputError(f"{args.input}: no documents (an empty corpus)")
    if args.score:
        cands = DF.balanced_test_set(docs, labels, args.score, args.seed)
    else:
        cands = DF.to_judge(docs, labels, args.only_missing_evidence)
    prompts = [DF.build_prompt(c.context, c.focus, c.head, c.label, c.tail) for c in cands]
    if args.prompts:
        write_jsonl(args.prompts, ({"doc": c.doc, "relation": c.relation, "sent_id": c.sent_id, "gold": c.gold,
                                    "prompt": p} for c, p in zip(cands, prompts)))
        print(f"wrote {len(prompts)} prompts to {args.prompts}")
        return 0
    t0 = time.perf_counter()
    if args.answers:
        completions = []
        for n, r in enumerate(read_jsonl(args.answers), 1):
            if not isinstance(r, dict):
                raise SystemExit(f"{args.answers}: record {n}: expected an object with a 'completion' field")
            completions.append(r.get("completion", ""))
        if len(completions) != len(prompts):
            raise SystemExit(f"{args.answers}: {len(completions)} completions for {len(prompts)} prompts")
    elif args.model:
        completions = DF.complete(cands, _model_generate_fn(args), args.batch_size) if cands else []
    else:
        raise SystemExit("give --prompts (to export), --answers (completions) or --model (generate here)")
    answers = [DF.parse_answer(c) for c in completions]
    seconds = time.perf_counter() - t0
    decisions = [DF.decision(a) for a in answers]
    print(f"## distant-supervision filter: {args.input}\n\n| statistic | value |\n|---|---|\n"
          f"| documents | {len(docs)} |\n| candidates | {len(cands)} |\n"
          f"| gold yes / no / unannotated | {sum(c.gold is True for c in cands)} / {sum(c.gold is False for c in cands)}"
          f" / {sum(c.gold is None for c in cands)} |\n"
          f"| decisions yes / no / unparsed | {decisions.count('yes')} / {decisions.count('no')} / "
          f"{decisions.count('unparsed')} |\n| seconds | {seconds:.2f} |\n")
    if args.decisions:
        write_jsonl(args.decisions, ({"doc": c.doc, "relation": c.relation, "sent_id": c.sent_id, "head": c.head,
                                      "label": c.label, "tail": c.tail, "gold": c.gold, "decision": d,
                                      "completion": text} for c, d, text in zip(cands, decisions, completions)))
        print(f"wrote {len(decisions)} decisions to {args.decisions}")
    if args.score:
        s = DF.score(answers, [bool(c.gold) for c in cands])
        print("| precision | recall | F1 | accuracy | n | unparsed |\n|---|---|---|---|---|---|\n"
              f"| {s['precision']:.3f} | {s['recall']:.3f} | {s['f1']:.3f} | {s['accuracy']:.3f} | {s['n']} | {s['unparsed']} |")
    if args.out:
        kept = dropped = 0
        with JsonArrayWriter(args.out) as w:
            for d, new in zip(docs, DF.relabel(docs, cands, answers)):
                kept += len(new["labels"])
                dropped += len(d.get("labels", [])) - len(new["labels"])
                w.write(new)
        print(f"kept {kept} relations, dropped {dropped}; wrote {args.out}")
    return 0


def _model_generate_fn(args):
    """Greedy generation with a model our stack loads (`memllm_jax.model.load` + decode), no memory reads."""
    from memllm_jax.decode.reader import encode_prompt, generate_with_memory
    from memllm_jax.memory import TripleMemory, load_encoder
    from memllm_jax.model.load import load

    model, tok = load(args.model, need_tokenizer=True)
    cfg = model.cfg
    memory = TripleMemory(load_encoder("hash:64"))  # empty: a base model does not call it

    def generate_fn(prompts):
        prompts = list(prompts)
        longest = max(len(encode_prompt(tok, p)) for p in prompts)
        if longest + args.max_new_tokens > cfg.max_seq_len:
            raise SystemExit(f"{args.model}/config.json: a Figure 5 prompt is {longest} tokens; with --max-new-tokens "
                             f"{args.max_new_tokens} it exceeds max_position_embeddings {cfg.max_seq_len}")
        results = generate_with_memory(model, tok, memory, prompts, args.max_new_tokens, batch_size=len(prompts))
        return [r.plain_text for r in results]

    return generate_fn
