r"""specjax's skinny-matmul CPU kernel against XLA:CPU's kernels, on the 270M's matrices.

A decode step multiplies one row by every matrix of the target, a verify call
gamma + 1 rows, a batch of B rows B times that. This times, side by side in
one run, the same float32 products computed by `cpu_kernels/skinny_matmul`
and by XLA's kernels as the model used them before it (`gemma.linear` with the
kernel off; for the head, `gemma.head_logits`' multiply-and-reduce from 2
rows and XLA's GEMV at one):

  body  18 layers' worth of each of the 270M's matrix shapes (distinct arrays,
        so the weights stream from memory as in the model), chained;
  head  the tied 262,144 x 640 table, every logit consumed by a max.

A third column, q8, computes the products of matrices held as int8 blocks
(`cpu_kernels/q8_matmul`) from those, in the embedded 270M's GGUF formats:
the head, and the q, k, v, gate and up projections, a scale per 32 weights
(Q8_0, Q5_0); o, a scale and an offset per 32 (Q4_K); down, a scale per 16
(Q6_K; half the 270M's down projections are Q4_K).

and prints, with the CPU model and flags, milliseconds per product at each
row count, kernel / XLA, and each one's cost relative to its own one-row
product (what a verify call pays over a decode step, product by product).
Weights are random float32: a product's speed does not depend on the values.

On the 2-core AVX-512 EPYC of 3 December 2026 (--rows=1,5,9 --repeats=5):

  | product | rows | xla ms | kernel ms | kernel / xla | xla / 1 row | kernel / 1 row |
  | body, 18 layers | 1 | 17.5 | 18.5 | 1.05 | 1.00 | 1.00 |
  | body, 18 layers | 5 | 27.6 | 24.3 | 0.88 | 1.58 | 1.31 |
  | body, 18 layers | 9 | 36.1 | 24.6 | 0.68 | 2.06 | 1.33 |
  | head | 1 | 24.9 | 26.7 | 1.08 | 1.00 | 1.00 |
  | head | 5 | 45.8 | 28.1 | 0.61 | 1.84 | 1.05 |
  | head | 9 | 55.1 | 37.3 | 0.68 | 2.22 | 1.40 |

On a 2-core Sapphire Rapids-class Xeon (5 December 2026, --rows=1,5,9
--repeats=5) the kernel as above, prefetching with the non-temporal hint, took
77.3 / 67.0 / 99.3 ms for the head at 1 / 5 / 9 rows against XLA's 29.5 / 42.9
/ 54.2; staged in L2 on Intel, 25.9 / 31.6 / 42.8 against 25.5 / 48.9 / 60.6
(experiments/2026-12-prefetch-intel-gemma270m-cpu/).

  .venv/bin/python benchmarks/skinny_matmul.py [--rows=1,2,3,5,9,16] [--repeats=10]
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import q8_matmul
from specjax.cpu_kernels import skinny_matmul
from specjax.models import config as config_lib
from specjax.models import gemma
from specjax.models import q8_weights

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import timing  # noqa: E402  pylint: disable=g-import-not-at-top

ROWS = flags.DEFINE_list('rows', ['1', '2', '3', '5', '9', '16'], 'Rows of x (positions x batch).')
REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed runs; each figure is the best.')


def compiled(fn, args, kernel_rows: int, q8: bool = False):
  """fn compiled with the kernel taking products of 1 to `kernel_rows` rows (0: none).
  The model leaves a single row to XLA (`skinny_matmul.MIN_ROWS`); this benchmark
  times the kernel on it too, beside XLA. `q8`: the args carry int8 forms, which
  take the q8 kernel."""
  saved = skinny_matmul.MIN_ROWS, skinny_matmul.MAX_ROWS, q8_matmul.MAX_ROWS
  skinny_matmul.MIN_ROWS, skinny_matmul.MAX_ROWS = 1, kernel_rows
  q8_matmul.MAX_ROWS = max(q8_matmul.MAX_ROWS, kernel_rows)  # past the model's limit too
  jax.clear_caches()  # the row limits are read when fn is traced, and traces are cached
  try:
    lowered = jax.jit(fn).lower(*args)
    if q8:
      assert q8_matmul.TARGET in lowered.as_text()
    else:
      assert (skinny_matmul.TARGET in lowered.as_text()) == (kernel_rows > 0)
    return lowered.compile()
  finally:
    skinny_matmul.MIN_ROWS, skinny_matmul.MAX_ROWS, q8_matmul.MAX_ROWS = saved


def body_chain(layers, x_NxD):
  """Every matrix of every layer, each layer's input depending on the last one's output."""
  total = jnp.float32(0)
  for w in layers:
    x_1xNxD = x_NxD[None]
    for name in ('q', 'k', 'v', 'gate', 'up'):
      y = gemma.linear(x_1xNxD, w[name], q8=w.get(name + q8_weights.Q8_SUFFIX))
      total = total + y.sum()
    o = gemma.linear(jnp.ones(x_1xNxD.shape[:2] + (w['o'].shape[1],)) * total * 1e-9, w['o'],
                     q8=w.get('o' + q8_weights.Q8_SUFFIX))
    down = gemma.linear(jnp.ones(x_1xNxD.shape[:2] + (w['down'].shape[1],)) * total * 1e-9,
                        w['down'], q8=w.get('down' + q8_weights.Q8_SUFFIX))
    x_NxD = x_NxD + 1e-3 * (o + down)[0]
  return total + x_NxD.sum()


def head_max(table, x_NxD):
  table_VxD, q8 = table if isinstance(table, tuple) else (table, None)
  return gemma.head_logits(x_NxD[None], table_VxD, q8).max(-1)


def int8_blocks(shape, rng, block=32, offset=False):
  """Random int8 values, float32 scales per `block` (and offsets), and the float32 matrix
  they make."""
  q = rng.integers(0 if offset else -127, 16 if offset else 128, size=shape, dtype=np.int8)
  scales = rng.random((2, shape[0], shape[1] // block), dtype=np.float32) * 1e-3
  form = (q, scales[0], scales[1]) if offset else (q, scales[0])
  form = tuple(jnp.asarray(a) for a in form)
  return q8_matmul.dequantize(*form), form


def main(argv):
  del argv
  print(cpu_info.describe())
  print(f'jax {jax.__version__}, float32; ms per product (best of {REPEATS.value}); '
        f'kernel built: {skinny_matmul.available()}\n')
  cfg = config_lib.get_model_config('gemma3-270m')
  d, heads, kv, h, f = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_dim
  shapes = {'q': (heads * h, d), 'k': (kv * h, d), 'v': (kv * h, d), 'o': (d, heads * h),
            'gate': (f, d), 'up': (f, d), 'down': (d, f)}
  rng = np.random.default_rng(0)
  layers, q8_layers = [], []
  for _ in range(cfg.num_layers):
    layer, q8_layer = {}, {}
    for k, shape in shapes.items():
      # the 270M's formats: Q5_0 and Q8_0, o Q4_K, down Q6_K (half of them)
      layer[k], q8 = int8_blocks(shape, rng, block=16 if k == 'down' else 32, offset=k == 'o')
      q8_layer[k] = layer[k]
      q8_layer[k + q8_weights.Q8_SUFFIX] = q8
    layers.append(layer)
    q8_layers.append(q8_layer)
  table_VxD, table_q8 = int8_blocks((cfg.vocab_size, d), rng)
  rows = [int(r) for r in ROWS.value]
  print('| product | rows | xla ms | kernel ms | q8 ms | kernel / xla | q8 / xla | xla / 1 row '
        '| kernel / 1 row | q8 / 1 row |')
  print('|---|---|---|---|---|---|---|---|---|---|')
  for name, fn, weights, q8_weights_ in (
      ('body, 18 layers', body_chain, layers, q8_layers),
      ('head', head_max, table_VxD, (table_VxD, table_q8))):
    one = {}
    for n in rows:
      x_NxD = jnp.ones((n, d), jnp.float32)
      ms = {}
      for form, kernel_rows, w in (('xla', 0, weights), ('kernel', max(rows), weights),
                                   ('q8', max(rows), q8_weights_)):
        ms[form] = timing.best_seconds(compiled(fn, (w, x_NxD), kernel_rows, form == 'q8'),
                                       w, x_NxD,
                                       repeats=REPEATS.value) * 1e3
        one.setdefault(form, ms[form])
      print(f'| {name} | {n} | {ms["xla"]:.1f} | {ms["kernel"]:.1f} | {ms["q8"]:.1f} | '
            f'{ms["kernel"] / ms["xla"]:.2f} | {ms["q8"] / ms["xla"]:.2f} | '
            f'{ms["xla"] / one["xla"]:.2f} | {ms["kernel"] / one["kernel"]:.2f} | '
            f'{ms["q8"] / one["q8"]:.2f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
