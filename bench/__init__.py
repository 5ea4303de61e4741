"""Benchmarks of sglang-pask: run as modules from the repository root, e.g. ``python -m bench.bfcl``."""
