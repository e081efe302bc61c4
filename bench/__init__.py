"""Benchmarks of judge-runner: `python bench/run.py --out bench/results.json` (see README.md)."""
