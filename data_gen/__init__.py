"""Offline dataset builders: DocRED-format loading, synthetic corpus, write/read/eval examples."""
