"""Two-hop questions (beyond the paper): the embedded default with a memory-read adapter that also learns two-hop
questions (two per training document, half their reads answered with other entities after the right one), decoded
with its reads kept in the context, and the `two_hop` stage's 200 questions over the held-out world. The block
alone: `memllm run --config two_hop --stage corpus --stage tokenizer --stage pretrain --stage mr --stage two_hop`."""

from experiments.pipeline_config import PipelineConfig
from memllm_jax.settings import replace


def get_config() -> PipelineConfig:
    return replace(PipelineConfig(), {"name": "two_hop", "data.read.two_hop": 2, "data.read.keep_reads": True,
                                      "data.read.two_hop_distractors": 0.5, "two_hop.questions": 200})


def sweep(add) -> None:
    """A second seed of the world, the documents and the example recipes (`memllm run --sweep`)."""
    add("seed1", "data.synth_seed=1")
    add("two_hop")
