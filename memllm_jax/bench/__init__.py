"""Benchmarks (`memllm bench ...`). Each reports ratios against a named peer measured in the same run,
interleaved A B A B, with medians and spreads; see `memllm_jax.bench.timing`."""
