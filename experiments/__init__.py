"""Experiment configs, the runner, tables and plots."""
