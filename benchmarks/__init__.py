"""Benchmarks of nnx_pool against flax.nnx and PyTorch CPU; run ``python -m benchmarks``."""
