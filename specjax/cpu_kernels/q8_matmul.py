"""x @ w.T in float32 where w is held as GGUF Q8_0 blocks (int8 values, one scale per 32), on CPU.

The embedded Gemma 3 270M's tied head, 262,144 x 640, is stored Q8_0 in its
GGUF: 189 MB as int8 values and float32 scales against 671 MB dequantized, and
it is 63% of what a decode step reads. `q8_matmul.cc` rebuilds each weight in
a register right before its multiply-adds. A Q8_0 weight (a float16 scale
times an int8) is exact in float32, so the product is the dequantized model's,
and it equals `skinny_matmul` over the dequantized matrix bit for bit (the same
sums in the same order): row n of y is the same whatever the number of rows.

A matrix's int8 form is the pair (int8 q[O, I], float32 scale[O, I / 32]),
made by `models/q8_weights.split`; `dequantize` gives back the float32 matrix.
`applies` says
whether a product can take the kernel: the CPU backend, float32 x, 1 to
MAX_ROWS rows and the kernel built (see build.py). Elsewhere callers use the
dequantized table. No gradient: the target is frozen.

Measured on a 2-core Sapphire Rapids-class Xeon (5 December 2026, random
Q8_0 values of the head's shape, best of 7; /tmp script, the figures as
printed), the head at 1 / 5 / 9 / 12 / 16 / 20 rows took 5.4-6.0 / 9.5-10.0 /
13.8-16.0 / 19.7-21.0 / 24.3-26.0 / 36.4-37.6 ms with two rows of w to a
512-bit register (two runs), 7.1 / 13.2 / 23.4 / 29.4 / 41.0 / 46.7 ms with
one to a 256-bit register (AVX2's path) in between, against the float32 skinny
kernel's 19-29 ms at 1 to 9 rows and XLA's float32 product's 24-38 ms at 1
to 9 rows and 40-56 ms at 12 to 20. Past 20 rows XLA's float32 matmul is as
fast (62 against 75 ms at 32, 256-bit path), hence MAX_ROWS.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.cpu_kernels import build

Array = jax.Array

KERNEL = 'q8_matmul'
TARGET = 'specjax_q8_matmul_f32'
BLOCK = 32  # Q8_0's weights per scale
MAX_ROWS = 20


def available() -> bool:
  """Whether the kernel is built and registered (builds it on the first call)."""
  return build.load(KERNEL, (TARGET,))


def applies(num_rows: int, x: Array) -> bool:
  return (jax.default_backend() == 'cpu' and 1 <= num_rows <= MAX_ROWS
          and x.dtype == jnp.float32 and available())


def dequantize(q_OxI: Array, scale_OxB: Array) -> Array:
  """The float32 matrix, q * scale: exact (Q8_0 weights fit float32)."""
  o, i = q_OxI.shape
  w = q_OxI.reshape(o, i // BLOCK, BLOCK).astype(jnp.float32) * scale_OxB[:, :, None]
  return w.reshape(o, i)


def q8_matmul(x_NxI: Array, q_OxI: Array, scale_OxB: Array) -> Array:
  """y[N, O] = x @ (q * scale).T by the kernel; call only where `applies` holds."""
  if not available():
    raise build.KernelBuildError(f'the {KERNEL} CPU kernel is not built: see the log for why')
  (n, i), (o, qi) = x_NxI.shape, q_OxI.shape
  if qi != i or i % BLOCK or scale_OxB.shape != (o, i // BLOCK) or x_NxI.dtype != jnp.float32 \
      or q_OxI.dtype != jnp.int8 or scale_OxB.dtype != jnp.float32:
    raise ValueError(f'q8_matmul: expected float32 x[N, I], int8 q[O, I] and float32 '
                     f'scale[O, I / {BLOCK}] with I a multiple of {BLOCK}; got x {x_NxI.dtype}'
                     f'{list(x_NxI.shape)}, q {q_OxI.dtype}{list(q_OxI.shape)}, scale '
                     f'{scale_OxB.dtype}{list(scale_OxB.shape)}')
  out = jax.ShapeDtypeStruct((n, o), jnp.float32)
  return jax.ffi.ffi_call(TARGET, out, vmap_method='sequential')(x_NxI, q_OxI, scale_OxB)
