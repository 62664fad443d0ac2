"""x @ w.T in float32 for a few rows of x against a large (out, in) matrix, on CPU.

A decode step multiplies one row by each of the target's matrices and a verify
call gamma + 1 rows; both read every weight once, so on a CPU both should cost
about the same. XLA:CPU's kernels do not overlap the reads with the arithmetic
on such skinny products: on a 2-core Zen 4 EPYC the 270M's tied head
(262,144 x 640) took 45.8 ms at 5 rows and 55.1 ms at 9 against 24.9 ms at
one (benchmarks/skinny_matmul.py, one run). `skinny_matmul.cc` streams the
matrix once with a prefetch ahead of the arithmetic, on XLA's own thread pool:
28.1 ms at 5 rows, 37.3 at 9 and 26.7 at one; the body's 18 layers 24.3 ms at
5 rows against 27.6 (18.5 and 17.5 at one).

Each output element is summed in the same order whatever the number of rows,
so row n of a product equals the product of row n alone, bit for bit (the
rest of a verify call, XLA's attention and norms, is not shape-invariant, so
its logits still differ from a decode step's in the last bits).

`applies` says whether a product takes the kernel: on the CPU backend, float32
operands, MIN_ROWS to MAX_ROWS rows and the kernel built (see build.py; without
a C++ compiler XLA's kernels are used). From 16 rows XLA's compute-bound
kernels are as fast or faster (head at 20 / 32 / 64 rows: 0.96 / 1.28 / 1.37 of
XLA's time). At exactly 16 rows XLA has a fast path: the body's 18 layers took
1.18 and 1.22 of XLA's time there in two runs against 0.80-0.87 at 12-15 rows,
and a batch-16 decode step of the 270M 3-9% longer (128 / 384 slots) with the
kernel (benchmarks/skinny_matmul.py and the model's step, 4 December 2026), so
the kernel stops at 15. A single row, a decode step, stays with XLA too: each of a step's
127 products then runs as XLA's own code, without an FFI call and a dispatch to
the thread pool, and 64 greedy tokens of the 270M took 40.1 ms a token against
42.8 with the kernel (the same run, 4 December 2026; 38.1 against 41.9 in
another). So rows of a verify call are bit-identical to each other's whatever
the call's width, but not to a decode step's row. Gradients flow through plain
matmuls.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.cpu_kernels import build

Array = jax.Array

KERNEL = 'skinny_matmul'
TARGET = 'specjax_skinny_matmul_f32'
MIN_ROWS = 2
MAX_ROWS = 15


def available() -> bool:
  """Whether the kernel is built and registered (builds it on the first call)."""
  return build.load(KERNEL, (TARGET,))


def applies(num_rows: int, x: Array, w: Array) -> bool:
  return (jax.default_backend() == 'cpu' and MIN_ROWS <= num_rows <= MAX_ROWS
          and x.dtype == jnp.float32 and w.dtype == jnp.float32 and available())


def _call(x_NxI: Array, w_OxI: Array) -> Array:
  if not available():
    raise build.KernelBuildError(f'the {KERNEL} CPU kernel is not built: see the log for why')
  out = jax.ShapeDtypeStruct((x_NxI.shape[0], w_OxI.shape[0]), jnp.float32)
  return jax.ffi.ffi_call(TARGET, out, vmap_method='sequential')(x_NxI, w_OxI)


@jax.custom_vjp
def skinny_matmul(x_NxI: Array, w_OxI: Array) -> Array:
  """y[N, O] = x @ w.T by the kernel; call only where `applies` holds."""
  return _call(x_NxI, w_OxI)


def _forward(x_NxI, w_OxI):
  return _call(x_NxI, w_OxI), (x_NxI, w_OxI)


def _backward(residuals, dy_NxO):
  x_NxI, w_OxI = residuals
  return dy_NxO @ w_OxI, dy_NxO.T @ x_NxI


skinny_matmul.defvjp(_forward, _backward)
