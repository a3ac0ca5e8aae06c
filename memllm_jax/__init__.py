"""memllm_jax: MemLLM (an LLM finetuned to use an explicit triple memory) in pure JAX."""

__version__ = "0.1.0"
