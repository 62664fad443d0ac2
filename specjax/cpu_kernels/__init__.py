"""Hand-written XLA:CPU kernels, compiled on first use (see build.py)."""
