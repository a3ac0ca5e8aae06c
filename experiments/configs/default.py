"""The embedded default (`make run`): `PipelineConfig()`'s defaults. A synthetic DocRED-format corpus whose evaluation
and outside documents come from a held-out world (their facts are in no training document, so only memory can
supply them), SmolLM2-135M as the base, both adapters, the memory stage with grounding and a confidence threshold
chosen on the outside documents, Table 2's eleven rows, the Table 3 analogue with 200 edits and the scaling curve."""

from experiments.pipeline_config import PipelineConfig


def get_config() -> PipelineConfig:
    return PipelineConfig()


def sweep(add) -> None:
    """A second seed of the world, the documents and the example recipes (`memllm run --sweep`)."""
    add("seed1", "data.synth_seed=1")
    add("default")
