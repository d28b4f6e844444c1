"""Benchmarks run by ``searchgym bench ...``; each prints its figures (and ratios against references)."""
