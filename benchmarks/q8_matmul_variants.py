r"""Variants of the int8-block matmul kernel's source, timed side by side in one process.

As `skinny_matmul_variants.py` does for the float32 kernel: each variant (a copy of
`specjax/cpu_kernels/q8_matmul.cc`, edited) is compiled with the product's flags and
registered as its own FFI target, and the variants take turns call by call, so the
machine's drift falls on all of them alike. The matrix is random Q8_0 (int8 values, one
float16-valued scale per block of 32) of `--matrix_rows` x `--inputs`, large enough by
default (84 MB) to come from memory as a forward pass's weights do. Every variant's
product must equal the first one's bit for bit (the kernel's contract), else the script
stops. Prints, with the CPU model and flags, the fastest and the median call of each at
each row count.

  .venv/bin/python benchmarks/q8_matmul_variants.py --rows=1,5,9 a.cc b.cc [...]
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

from specjax.cpu_kernels import q8_matmul

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import kernel_variants  # noqa: E402  pylint: disable=g-import-not-at-top

ROWS = flags.DEFINE_list('rows', ['1', '5', '9'], 'Rows of x.')
ROUNDS = flags.DEFINE_integer('rounds', 15, 'Turns each variant takes at each row count.')
MATRIX_ROWS = flags.DEFINE_integer('matrix_rows', 131_072, 'Rows of w (outputs).')
INPUTS = flags.DEFINE_integer('inputs', 640, 'Columns of w (inputs): 640 as the 270M\'s '
                              'projections and head, 2048 as its MLP\'s down projection.')
OFFSET = flags.DEFINE_bool('offset', False, 'Time the kernel with an offset a block '
                            '(w = q * scale - offset, as Q4_K\'s weights) instead.')
COPIES = flags.DEFINE_integer('copies', 1, 'Distinct matrices of that shape, multiplied in turn '
                              'in one program (each product feeding the next x), so that small '
                              'ones come from memory, as a forward pass\'s layers do; a call\'s '
                              'time is the program\'s over this.')
BLOCK = 32


def register(source: Path, index: int, workdir: Path) -> str:
  """Compiles `source` with its handlers renamed, registers both, returns the one timed."""
  target = f'specjax_q8_matmul_variant_{index}'
  library = kernel_variants.compile_variant(
      source, {q8_matmul.OFFSET_TARGET: f'{target}_offset', q8_matmul.TARGET: target}, workdir,
      index)
  for name in (target, f'{target}_offset'):
    kernel_variants.register(library, name)
  return f'{target}_offset' if OFFSET.value else target


def main(argv):
  sources = [Path(a) for a in argv[1:]]
  if not sources:
    raise SystemExit('name one or more variant sources (copies of q8_matmul.cc)')
  print(cpu_info.describe())
  o, i = MATRIX_ROWS.value, INPUTS.value
  rng = np.random.default_rng(0)

  def half_floats(shape, low, high):
    return jnp.asarray(rng.uniform(low, high, shape).astype(np.float16).astype(np.float32))

  copies = []
  for _ in range(COPIES.value):
    copy = (jnp.asarray(rng.integers(-127, 128, (o, i), dtype=np.int8)),
            half_floats((o, i // BLOCK), 1e-3, 1e-2))
    copies.append(copy + ((half_floats((o, i // BLOCK), 0, 1e-2),) if OFFSET.value else ()))
  with tempfile.TemporaryDirectory() as workdir:
    targets = [register(s, k, Path(workdir)) for k, s in enumerate(sources)]
    print(f'jax {jax.__version__}; {COPIES.value} x {"offset " if OFFSET.value else ""}Q8_0 '
          f'w[{o}, {i}], ms per call: fastest / median of '
          f'{ROUNDS.value}\n')
    print('| rows | ' + ' | '.join(s.name for s in sources) + ' |')
    print('|---|' + '---|' * len(sources))
    for n in (int(r) for r in ROWS.value):
      x_NxI = jnp.asarray(rng.standard_normal((n, i), dtype=np.float32))
      out = jax.ShapeDtypeStruct((n, o), jnp.float32)

      def chain(x, weights, target):
        ys = []
        for w in weights:   # each product feeds the next call, so they run in turn
          ys.append(jax.ffi.ffi_call(target, out)(x, *w))
          x = x + 0.0 * ys[-1][:, :1]
        return jnp.stack(ys)

      fns = [jax.jit(lambda x, w, t=t: chain(x, w, t)) for t in targets]
      first = [np.asarray(fn(x_NxI, copies)) for fn in fns]
      for source, y in zip(sources[1:], first[1:]):
        if not np.array_equal(y.view(np.uint32), first[0].view(np.uint32)):
          raise SystemExit(f'{source} differs from {sources[0]} at {n} rows')
      seconds = kernel_variants.in_turns(
          [lambda fn=fn: fn(x_NxI, copies) for fn in fns], ROUNDS.value)
      per_call = 1e3 / COPIES.value
      print(f'| {n} | ' + ' | '.join(f'{min(t) * per_call:.3f} / {np.median(t) * per_call:.3f}'
                                     for t in seconds) + ' |', flush=True)


if __name__ == '__main__':
  app.run(main)
