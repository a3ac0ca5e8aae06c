"""Beyond the paper, all three at once: the embedded default with one memory-read adapter that also learns to say
`protocol.ABSTAIN` after an empty read (memory-aware answers), two-hop questions read in a chain with its reads kept
in the context, and a corpus with relations outside DocRED's labels named by a phrase of the sentence, 8 of them
held out by relation, the writer also trained on such sentences alone (as an edit states them). Its report adds
the absent-fact block to the Table 3 analogue, the phrase-relation edits (held-out and seen relations) and the
two-hop block; `memllm chat --keep-empty --keep-reads` talks to its adapters.
"""

from experiments.pipeline_config import PipelineConfig
from memllm_jax.settings import replace


def get_config() -> PipelineConfig:
    return replace(PipelineConfig(), {
        "name": "beyond_paper", "data.phrase_relations": True, "data.write.lone_phrases": 3,
        "data.read.absent_questions": 1, "data.read.absent_form": "mixed",
        "editing.keep_empty": True, "editing.absent_questions": 200,
        "data.read.two_hop": 2, "data.read.keep_reads": True, "data.read.two_hop_distractors": 0.5,
        "two_hop.questions": 200})


def sweep(add) -> None:
    """A second seed of the world, the documents and the example recipes (`memllm run --sweep`)."""
    add("seed1", "data.synth_seed=1")
    add("beyond_paper")
