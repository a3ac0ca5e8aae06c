"""The triple memory (paper §3.1): entity / relation / triple tables, a Flax BERT name encoder, ScaNN or
exact vector indices, batched queries with the paper's thresholds, and an atomic on-disk format."""

from memllm_jax.memory.encoder import BertEncoder, Encoder, HashEncoder, load_encoder
from memllm_jax.memory.files import MemoryFileError
from memllm_jax.memory.store import MemoryInputError, QueryResult, TripleMemory

__all__ = ["BertEncoder", "Encoder", "HashEncoder", "MemoryFileError", "MemoryInputError", "QueryResult",
           "TripleMemory", "load_encoder"]
