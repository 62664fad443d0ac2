r"""Whether the 270M's matrices would run faster stored (in, out) than (out, in), on this CPU.

specjax stores every matrix as the GGUF and Hugging Face give it, (out, in),
and computes x @ w.T (`gemma.linear`, which this times for that layout); the
tied head is the embedding table, (V, D). XLA:CPU picks a different kernel for each layout, and at the few rows
of a verify call (gamma + 1 positions) the kernels differ most. This times,
side by side in one run, the same products with the weights stored both ways:

  body  18 layers' worth of each of the 270M's matrix shapes (distinct arrays,
        so the weights stream from memory as in the model), x[N, in] against
        w stored (out, in) and, transposed once beforehand, (in, out);
  head  x[N, 640] against the 262,144 x 640 table stored (V, D), as the model
        computes it (`gemma.head_logits`), and stored (D, V) as a plain
        matmul, every logit consumed by a max.

and prints, with the CPU model and flags, milliseconds per product at each
row count and the ratio (in, out) / (out, in). Weights are random float32
(a product's speed does not depend on the values).

On the 2-core AVX-512 EPYC of 3 December 2026 the body's products showed no
layout that wins at every row count: (in, out) / (out, in) ranged 0.45-1.41
over two runs, by shape and row count, with no pattern that held across them.
The head stored (D, V) was cheaper in all three runs: 0.88, 0.84 and 0.90 of
`head_logits` at 1, 5 and 9 rows in the run against the model's own form
(against a plain (V, D) matmul, 0.54-0.80). A whole-270M prototype (not in
the repository) moved a call little: with the head stored (D, V), 41.9 / 74.7
ms at 1 / 5 positions against 43.9 / 79.4; with the body stored (in, out) as
well, 42.9 / 71.8. Storing the table (D, V) would cost a second copy of it
(671 MB in float32) or an embedding gathered from columns.

  .venv/bin/python benchmarks/matmul_layout.py [--rows=1,5,9] [--repeats=10]
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import skinny_matmul
from specjax.models import config as config_lib
from specjax.models import gemma

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import timing  # noqa: E402  pylint: disable=g-import-not-at-top

ROWS = flags.DEFINE_list('rows', ['1', '5', '9'], 'Rows of x (positions x batch).')
REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed runs; each figure is the best.')


def _best_ms(fn, *args) -> float:
  return timing.best_seconds(fn, *args, repeats=REPEATS.value) * 1e3


def _chain(product):
  """One product per layer, each layer's input depending on the last one's output."""
  def run(ws, x_NxI):
    total = jnp.float32(0)
    for w in ws:
      y_NxO = product(w, x_NxI)
      total = total + y_NxO.sum()
      x_NxI = x_NxI + 1e-3 * y_NxO[:, :1]
    return total
  return jax.jit(run)


def main(argv):
  del argv
  # XLA's kernels in both layouts (benchmarks/skinny_matmul.py times specjax's own).
  skinny_matmul.MAX_ROWS = 0
  print(cpu_info.describe())
  cfg = config_lib.get_model_config('gemma3-270m')
  d, heads, kv, h, f = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_dim
  shapes = {'q': (heads * h, d), 'k, v': (kv * h, d), 'o': (d, heads * h),
            'gate, up': (f, d), 'down': (d, f)}
  rows = [int(r) for r in ROWS.value]
  rng = np.random.default_rng(0)
  out_in = _chain(lambda w_OxI, x_NxI: gemma.linear(x_NxI[None], w_OxI)[0])   # as the model does
  in_out = _chain(lambda w_IxO, x_NxI: jnp.einsum('ni,io->no', x_NxI, w_IxO))
  print(f'jax {jax.__version__}, float32; ms per product (best of {REPEATS.value})\n')
  print('| matrix | rows | (out, in) ms | (in, out) ms | (in, out) / (out, in) |')
  print('|---|---|---|---|---|')
  for name, (o, i) in shapes.items():
    host = [rng.standard_normal((o, i), dtype=np.float32) * 0.02 for _ in range(cfg.num_layers)]
    w_oi = [jnp.asarray(w) for w in host]
    w_io = [jnp.asarray(np.ascontiguousarray(w.T)) for w in host]
    for n in rows:
      x = jnp.ones((n, i), jnp.float32)
      a = _best_ms(out_in, w_oi, x) / cfg.num_layers
      b = _best_ms(in_out, w_io, x) / cfg.num_layers
      print(f'| {name} {o}x{i} | {n} | {a:.3f} | {b:.3f} | {b / a:.2f} |', flush=True)
  del w_oi, w_io
  table = rng.standard_normal((cfg.vocab_size, d), dtype=np.float32) * 0.02
  table_VxD = jnp.asarray(table)
  table_DxV = jnp.asarray(np.ascontiguousarray(table.T))
  del table
  head_vd = jax.jit(lambda w, x: gemma.head_logits(x[None], w).max(-1))   # as the model does
  head_dv = jax.jit(lambda w, x: jnp.einsum('nd,dv->nv', x, w).max(-1))
  print('\n| head | rows | (V, D) ms | (D, V) ms | (D, V) / (V, D) |')
  print('|---|---|---|---|---|')
  for n in rows:
    x = jnp.ones((n, d), jnp.float32)
    a, b = _best_ms(head_vd, table_VxD, x), _best_ms(head_dv, table_DxV, x)
    print(f'| {cfg.vocab_size}x{d} | {n} | {a:.1f} | {b:.1f} | {b / a:.2f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
