"""Experiment configs: each module has get_config() and optionally sweep(add)."""
