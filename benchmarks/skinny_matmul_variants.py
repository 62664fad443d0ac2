r"""Variants of the skinny-matmul kernel's source, timed side by side in one process.

Tuning the kernel on a shared 2-core machine means telling 5-10% apart under
noise of 20-50% between runs. Each variant (a copy of
`specjax/cpu_kernels/skinny_matmul.cc`, edited) is compiled with the product's
flags, registered as its own FFI target, and the variants take turns call by
call on the tied head (262,144 x 640, random float32; every logit consumed by a
max), so the machine's drift falls on all of them alike. Prints, with the CPU
model and flags, the fastest and the median call of each at each row count.

On a 2-core Sapphire Rapids-class Xeon (5 December 2026), the prefetch hints
(fastest of 15 turns, ms; run with this script's first draft, the same method):

  | rows | L2 (prefetcht1, shipped) | L2, once per line | no prefetch | non-temporal |
  | 1 | 26.9 | 25.5 | 28.9 | 65.9 |
  | 5 | 30.6 | 30.9 | 44.0 | 76.4 |
  | 9 | 40.9 | 37.6 | 62.2 | 103.7 |

  .venv/bin/python benchmarks/skinny_matmul_variants.py --rows=1,5,9 a.cc b.cc [...]
"""

from __future__ import annotations

import os
from pathlib import Path
import sys
import tempfile

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import skinny_matmul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import kernel_variants  # noqa: E402  pylint: disable=g-import-not-at-top

ROWS = flags.DEFINE_list('rows', ['1', '5', '9'], 'Rows of x.')
ROUNDS = flags.DEFINE_integer('rounds', 15, 'Turns each variant takes at each row count.')
MATRIX_ROWS = flags.DEFINE_integer(
    'matrix_rows', 262_144, 'Rows of w: the head by default; 16,384 (42 MB) sits in a large L3 '
    'and times the arithmetic without the memory.')


def register(source: Path, index: int, workdir: Path) -> str:
  """Compiles `source` with its handler renamed, registers it, and returns the new target name."""
  target = f'specjax_skinny_matmul_variant_{index}'
  library = kernel_variants.compile_variant(source, {skinny_matmul.TARGET: target}, workdir,
                                            index)
  return kernel_variants.register(library, target)


def main(argv):
  sources = [Path(a) for a in argv[1:]]
  if not sources:
    raise SystemExit('name one or more variant sources (copies of skinny_matmul.cc)')
  print(cpu_info.describe())
  with tempfile.TemporaryDirectory() as workdir:
    targets = [register(s, k, Path(workdir)) for k, s in enumerate(sources)]
    w_VxD = jnp.asarray(np.random.default_rng(0).standard_normal((MATRIX_ROWS.value, 640),
                                                                 dtype=np.float32))
    print(f'jax {jax.__version__}; w[{MATRIX_ROWS.value}, 640], ms per call: fastest / median of '
          f'{ROUNDS.value}\n')
    print('| rows | ' + ' | '.join(s.name for s in sources) + ' |')
    print('|---|' + '---|' * len(sources))
    for n in (int(r) for r in ROWS.value):
      x_NxD = jnp.ones((n, 640), jnp.float32)
      out = jax.ShapeDtypeStruct((n, w_VxD.shape[0]), jnp.float32)
      fns = [jax.jit(lambda x, w, t=t: jax.ffi.ffi_call(t, out)(x, w).max(-1)) for t in targets]
      for fn in fns:
        fn(x_NxD, w_VxD).block_until_ready()
      seconds = kernel_variants.in_turns(
          [lambda fn=fn: fn(x_NxD, w_VxD) for fn in fns], ROUNDS.value)
      print(f'| {n} | ' + ' | '.join(f'{min(t) * 1e3:.1f} / {np.median(t) * 1e3:.1f}'
                                     for t in seconds) + ' |', flush=True)


if __name__ == '__main__':
  app.run(main)
