r"""The attention of a decode step or a verify call: XLA's einsums against specjax's CPU kernel.

The attention core alone (queries already projected, the cache already
written), for all 18 layers of Gemma 3 270M's shape: 4 query heads on one K/V
head of 256, 15 local layers with a 512-token window and 3 global ones, each
layer its own [B, S, 1, 256] key and value buffers. Two forms, as
`gemma.Attention` runs them:

  xla     a local layer slices its window out of the cache (`window_slots`),
          then the masked einsums, softmax between;
  kernel  the whole cache and the mask to `cpu_kernels/attention`, which
          reads only the slots some query of the row may see.

Rows at `--positions` (a batch's rows 7 positions apart), `--tokens` new tokens
a row. Prints, with the CPU model and flags, milliseconds for the 18 layers
(best of `--rounds` interleaved rounds, each a jitted loop of 20 calls) and
the kernel's time over XLA's. A decode step of the whole model takes 30-45 ms
on a 2-core EPYC, so these are its attention's share.

  .venv/bin/python benchmarks/attention.py [--num_slots=1024] [--positions=300,1000]
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import attention as attention_lib
from specjax.models import gemma

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

SLOTS = flags.DEFINE_integer('num_slots', 1024, 'KV cache slots.')
POSITIONS = flags.DEFINE_list('positions', ['300', '1000'], 'Position of the first row.')
TOKENS = flags.DEFINE_list('tokens', ['1', '5', '9'], 'New tokens per row.')
BATCHES = flags.DEFINE_list('batches', ['1', '4'], 'Batch sizes.')
ROUNDS = flags.DEFINE_integer('rounds', 5, 'Interleaved rounds; each figure is the best.')

LAYERS, WINDOW, GLOBAL_EVERY, HEADS, HEAD_DIM = 18, 512, 6, 4, 256
_CALLS = 20


def xla_layer(q, key, value, positions_BxT, local: bool):
  b, t = positions_BxT.shape
  num_slots = key.shape[1]
  window = WINDOW if local else None
  length = None if window is None else gemma.window_slots(num_slots, window, t)
  slots_BxS = jnp.broadcast_to(jnp.arange(num_slots), (b, num_slots))
  if length is not None:
    first_B = jnp.clip(positions_BxT[:, 0] - window + 1, 0, num_slots - length)
    key, value = gemma._read_window({'k': key, 'v': value}, first_B, length)  # pylint: disable=protected-access
    slots_BxS = first_B[:, None] + jnp.arange(length)[None]
  mask_BxTxS = gemma.attention_mask(positions_BxT, slots_BxS, window)
  return attention_lib.xla_attention(q, key, value, mask_BxTxS)


def kernel_layer(q, key, value, positions_BxT, local: bool):
  b, num_slots = positions_BxT.shape[0], key.shape[1]
  slots_BxS = jnp.broadcast_to(jnp.arange(num_slots), (b, num_slots))
  mask_BxTxS = gemma.attention_mask(positions_BxT, slots_BxS, WINDOW if local else None)
  return attention_lib.attention(q, key, value, mask_BxTxS)


def all_layers(layer):
  @jax.jit
  def run(q_LxBxTxKxGxH, keys, values, positions_BxT):
    def body(_, total):
      outs = [layer(q_LxBxTxKxGxH[i] + total * 0, keys[i], values[i], positions_BxT,
                    (i + 1) % GLOBAL_EVERY != 0) for i in range(LAYERS)]
      return total + sum(o.sum() for o in outs) * 1e-9
    return jax.lax.fori_loop(0, _CALLS, body, jnp.float32(0))
  return run


def main(argv):
  del argv
  print(cpu_info.describe())
  assert attention_lib.available(), 'the attention kernel did not build: see the log'
  slots = SLOTS.value
  print(f'jax {jax.__version__}; attention of {LAYERS} layers (Gemma 3 270M shape), {slots} cache '
        f'slots, ms per call\n')
  print('| first row at | batch | new tokens | xla ms | kernel ms | kernel / xla |')
  print('|---|---|---|---|---|---|')
  forms = {'xla': all_layers(xla_layer), 'kernel': all_layers(kernel_layer)}
  rng = np.random.default_rng(0)
  for position in (int(p) for p in POSITIONS.value):
    for batch in (int(b) for b in BATCHES.value):
      for tokens in (int(t) for t in TOKENS.value):
        if position + tokens > slots or position - 7 * (batch - 1) < 0:
          continue
        q = jnp.asarray(rng.normal(size=(LAYERS, batch, tokens, 1, HEADS, HEAD_DIM)) * 0.06,
                        jnp.float32)
        keys, values = ([jnp.asarray(rng.normal(size=(batch, slots, 1, HEAD_DIM)), jnp.float32)
                         for _ in range(LAYERS)] for _ in range(2))
        positions_BxT = jnp.asarray(position - 7 * np.arange(batch)[:, None]
                                    + np.arange(tokens)[None], jnp.int32)
        for local in (True, False):   # both forms compute the same attention
          np.testing.assert_allclose(
              kernel_layer(q[0], keys[0], values[0], positions_BxT, local),
              xla_layer(q[0], keys[0], values[0], positions_BxT, local), rtol=1e-4, atol=1e-5)
        best = {}
        for name, run in forms.items():
          jax.block_until_ready(run(q, keys, values, positions_BxT))
        for _ in range(ROUNDS.value):
          for name, run in forms.items():
            start = time.perf_counter()
            jax.block_until_ready(run(q, keys, values, positions_BxT))
            best[name] = min(best.get(name, float('inf')), (time.perf_counter() - start) / _CALLS)
        print(f'| {position} | {batch} | {tokens} | {best["xla"] * 1e3:.2f} | '
              f'{best["kernel"] * 1e3:.2f} | {best["kernel"] / best["xla"]:.2f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
