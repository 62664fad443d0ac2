"""What a target call over n + 1 positions costs, relative to a decode step, measured.

The adaptive draft length (`draft_length.py`) weighs expected accepted tokens
against these costs, so they must be this device's and this batch size's: a
verify call over 5 positions costs about 1.6 decode steps on a 2-core AVX2
CPU at batch 1 and can cost several at batch 16. Each width is one jitted
loop of forward passes over a cache of the batch's shape, timed after a
compile-and-warm-up run (the minimum of a few repeats).
"""

from __future__ import annotations

import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp

_STEPS = 4   # forward calls per timed program
_REPEATS = 3


@functools.partial(jax.jit, static_argnames=('model', 'width', 'batch', 'num_slots'))
def _calls(model, params, *, width: int, batch: int, num_slots: int):
  cache = model.init_cache(batch, num_slots)
  start = max(0, num_slots // 2 - _STEPS * width)

  def body(i, carry):
    cache, total = carry
    positions_BxT = jnp.broadcast_to(start + i * width + jnp.arange(width), (batch, width))
    out = model.forward(params, jnp.zeros((batch, width), jnp.int32), positions_BxT, cache)
    return out.cache, total + out.logits_BxRxV[:, :, 0].sum()

  return jax.lax.fori_loop(0, _STEPS, body, (cache, jnp.float32(0)))[1]


def seconds_per_call(model, params, width: int, *, batch: int, num_slots: int) -> float:
  """Seconds of one target call over `width` positions per row (best of a few)."""
  run = functools.partial(_calls, model, params, width=width, batch=batch, num_slots=num_slots)
  run().block_until_ready()
  best = float('inf')
  for _ in range(_REPEATS):
    start = time.perf_counter()
    run().block_until_ready()
    best = min(best, time.perf_counter() - start)
  return best / _STEPS


def measure(model, params, buckets: Sequence[int], *, batch: int, num_slots: int
            ) -> tuple[float, ...]:
  """Relative cost of a call verifying n drafts, for each n in `buckets` (n = 0 is 1.0)."""
  base = seconds_per_call(model, params, 1, batch=batch, num_slots=num_slots)
  return tuple(1.0 if n == 0 else max(1.0, seconds_per_call(
      model, params, n + 1, batch=batch, num_slots=num_slots) / base) for n in buckets)
