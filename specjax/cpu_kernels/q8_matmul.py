"""x @ w.T in float32 where w is held as int8 blocks (GGUF's Q8_0, Q5_0, Q4_K, Q6_K), on CPU.

The embedded Gemma 3 270M's tied head, 262,144 x 640, is stored Q8_0 in its
GGUF: 189 MB as int8 values and float32 scales against 671 MB dequantized, and
it is 63% of what a decode step reads. `q8_matmul.cc` rebuilds each weight in
a register right before its multiply-adds. A Q8_0 weight (a float16 scale
times an int8) is exact in float32, so the product is the dequantized model's,
and it equals `skinny_matmul` over the dequantized matrix bit for bit (the same
sums in the same order): row n of y is the same whatever the number of rows.

A matrix's int8 form is int8 q[O, I] and float32 scale[O, I / B], one scale
per block of B weights (B is BLOCK_SIZES: 32 for Q8_0, Q5_0 and Q4_K, 16 for
Q6_K), and for Q4_K's weights an offset[O, I / B] too: w = q * scale,
or q * scale - offset. `models/q8_weights.split` makes it; `dequantize` gives
back the float32 matrix. `applies` says whether a product can take the
kernel: the CPU backend, float32 x, 1 to MAX_ROWS rows and the kernel built
(see build.py). Elsewhere callers use the dequantized table. No gradient: the
target is frozen.

Measured on a 2-core Sapphire Rapids-class Xeon (5 December 2026, random
Q8_0 values of the head's shape, best of 7; /tmp script, the figures as
printed), the head at 1 / 5 / 9 / 12 / 16 / 20 rows took 5.4-6.0 / 9.5-10.0 /
13.8-16.0 / 19.7-21.0 / 24.3-26.0 / 36.4-37.6 ms with two rows of w to a
512-bit register (two runs), 7.1 / 13.2 / 23.4 / 29.4 / 41.0 / 46.7 ms with
one to a 256-bit register (AVX2's path) in between, against the float32 skinny
kernel's 19-29 ms at 1 to 9 rows and XLA's float32 product's 24-38 ms at 1
to 9 rows and 40-56 ms at 12 to 20. With every matrix of the 270M in int8
forms (the same Xeon, later that day; benchmarks/skinny_matmul.py
--rows=20,24,32,48,64), the head at 20 / 24 / 32 / 48 rows took 0.69 / 0.71 /
1.07 / 1.23 of XLA's float32 time and the 18 layers' products 0.72 / 0.80 /
0.76 / 0.99: the kernel's multiply-adds bound it there, and XLA's matmul does
them faster from 32 rows. Hence MAX_ROWS = 24 (a verify call over 3 positions
at batch 8, 6 at batch 4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import build

Array = jax.Array

KERNEL = 'q8_matmul'
TARGET = 'specjax_q8_matmul_f32'
OFFSET_TARGET = 'specjax_q8_offset_matmul_f32'  # w = q * scale - offset
MAX_ROWS = 24
BLOCK_SIZES = (16, 32)  # weights per scale, each a build of the kernel's loops


def available() -> bool:
  """Whether the kernel is built and registered (builds it on the first call)."""
  return build.load(KERNEL, (TARGET, OFFSET_TARGET))


def applies(num_rows: int, x: Array) -> bool:
  return (jax.default_backend() == 'cpu' and 1 <= num_rows <= MAX_ROWS
          and x.dtype == jnp.float32 and available())


def block_size(q_OxI: Array, scale_OxB: Array) -> int | None:
  """B, the weights per scale, or None where the shapes are not a form's."""
  if np.ndim(q_OxI) != 2 or np.ndim(scale_OxB) != 2 or q_OxI.shape[0] != scale_OxB.shape[0]:
    return None
  (_, i), (_, blocks) = q_OxI.shape, scale_OxB.shape
  if not blocks or i % blocks:
    return None
  b = i // blocks
  return b if b in BLOCK_SIZES else None


def dequantize(q_OxI: Array, scale_OxB: Array, offset_OxB: Array | None = None) -> Array:
  """The float32 matrix, q * scale (- offset): exact (the forms' products fit float32)."""
  o, i = q_OxI.shape
  b = i // scale_OxB.shape[1]
  w = q_OxI.reshape(o, i // b, b).astype(jnp.float32) * scale_OxB[:, :, None]
  if offset_OxB is not None:
    w = w - offset_OxB[:, :, None]
  return w.reshape(o, i)


def q8_matmul(x_NxI: Array, q_OxI: Array, scale_OxB: Array,
              offset_OxB: Array | None = None) -> Array:
  """y[N, O] = x @ (q * scale - offset).T by the kernel; call only where `applies` holds."""
  if not available():
    raise build.KernelBuildError(f'the {KERNEL} CPU kernel is not built: see the log for why')
  operands = [x_NxI, q_OxI, scale_OxB] + ([] if offset_OxB is None else [offset_OxB])
  if (np.ndim(x_NxI) != 2 or block_size(q_OxI, scale_OxB) is None
      or x_NxI.shape[1] != q_OxI.shape[1] or x_NxI.dtype != jnp.float32
      or q_OxI.dtype != jnp.int8 or scale_OxB.dtype != jnp.float32
      or (offset_OxB is not None and (offset_OxB.shape != scale_OxB.shape
                                      or offset_OxB.dtype != jnp.float32))):
    raise ValueError('q8_matmul: expected float32 x[N, I], int8 q[O, I], float32 scale[O, I / B] '
                     f'(and an offset like scale), B in {BLOCK_SIZES}; got '
                     + ', '.join(f'{a.dtype}{list(a.shape)}' for a in operands))
  out = jax.ShapeDtypeStruct((x_NxI.shape[0], q_OxI.shape[0]), jnp.float32)
  target = TARGET if offset_OxB is None else OFFSET_TARGET
  return jax.ffi.ffi_call(target, out, vmap_method='sequential')(*operands)
