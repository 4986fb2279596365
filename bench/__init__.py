"""Benchmarks of tensor-fusion-extender: ratios measured side by side in one run (see bench/README.md)."""
