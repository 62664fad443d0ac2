"""The best of a few timed runs of a jitted function, compiled and warmed up first:
the figure the side-by-side benchmarks compare (the least disturbed run)."""

from __future__ import annotations

import time

import jax


def best_seconds(fn, *args, repeats: int = 5) -> float:
  jax.block_until_ready(fn(*args))
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best
