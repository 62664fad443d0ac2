r"""The tied head's cost against the number of positions it scores, as XLA:CPU compiles it.

A verify call over gamma + 1 positions runs the 262,144 x 640 head on
gamma + 1 rows; a decode step on one. This prints, for N = 1..16 rows, the
head's CPU time (all threads; steadier than wall time on a shared machine)
relative to N = 1, in three forms: the matmul in the model's layout
(W[V, D] @ x[N, D]^T, as `gemma.linear` computes it with XLA's kernels), the
plain x @ W^T, and what the model's head runs (`gemma.head_logits`: on CPU
specjax's skinny-matmul kernel for 2 to 15 rows, where it is built; see
benchmarks/skinny_matmul.py). Every logit is consumed (an argmax), or XLA would
slice the matmul away. On the 2-core AVX2 EPYC of December 2026 the cost came in steps
(N = 2-4, 5-8 and 9-16 each cost about the same), so a chain of 4 drafts
(5 rows) pays what 7 drafts or a 7-node tree would. On the 2-core AVX-512 EPYC of
2 December 2026 the multiply-and-reduce took 26-30 ms at 5 rows against 34-45 ms for
the matmul, with N = 1 at 15-18 ms.

  python benchmarks/head_kernel.py [--max_rows=16] [--repeats=5]
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import cpu_info
from specjax.models import gemma

VOCAB, WIDTH = 262_144, 640


def cpu_ms(fn, *args, repeats: int) -> float:
  fn(*args).block_until_ready()
  best = float('inf')
  for _ in range(repeats):
    start = time.process_time()
    fn(*args).block_until_ready()
    best = min(best, time.process_time() - start)
  return best * 1e3


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--max_rows', type=int, default=16)
  parser.add_argument('--repeats', type=int, default=5)
  args = parser.parse_args()
  print(cpu_info.describe())
  print(f'jax {jax.__version__}, backend {jax.default_backend()}')
  rng = np.random.default_rng(0)
  w_VxD = jnp.asarray(rng.normal(size=(VOCAB, WIDTH)).astype(np.float32) * 0.05)
  model_layout = jax.jit(lambda w, x: jnp.argmax(
      jax.lax.optimization_barrier(jnp.einsum('oi,ni->on', w, x)), axis=0))
  plain_layout = jax.jit(lambda w, x: jnp.argmax(jnp.einsum('ni,oi->no', x, w), axis=1))
  head = jax.jit(lambda w, x: jnp.argmax(gemma.head_logits(x[None], w)[0], axis=-1))
  forms = (model_layout, plain_layout, head)
  rows = []
  for n in range(1, args.max_rows + 1):
    x_NxD = jnp.asarray(rng.normal(size=(n, WIDTH)).astype(np.float32))
    rows.append((n, *(cpu_ms(f, w_VxD, x_NxD, repeats=args.repeats) for f in forms)))
  base = rows[0][1]
  print('\n| rows N | W @ x^T (ms CPU) | / N=1 | x @ W^T (ms CPU) | / N=1 '
        '| head_logits (ms CPU) | / N=1 |')
  print('|---|---|---|---|---|---|---|')
  for n, *times in rows:
    print(f'| {n} | ' + ' | '.join(f'{t:.1f} | {t / base:.2f}' for t in times) + ' |')


if __name__ == '__main__':
  main()
