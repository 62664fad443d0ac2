"""x @ w.T in float32 for a matrix held as int8 blocks, by Intel AMX tile products, on CPU.

At one row a product of the 270M's layers is bound by reading its int8
weights, and `q8_matmul` reads them at that speed. At 5 to 64 rows (a verify
call, a batch) `q8_matmul` is bound instead by its float32 multiply-adds, one
a row for every weight. An AMX tile product (`q8_amx.cc`) multiplies int8
weights as they are, 16 x 16 x 32 of them an instruction, exactly in int32,
against x written as integers: 3 signed bytes per element, x rounded to 22
bits of its block's largest magnitude. Its float32 result differs from
`q8_matmul`'s by rounding only (on the 270M the logits differ from XLA's
float32 forward by 7.3e-5 at most, `q8_matmul`'s by 7.2e-5; the .cc file
gives the bound), and row n of y is the same bits whatever the number of rows,
so a decode step and a verify call agree.

The weights are read in a tile layout made at load (`tile_form`). `applies`
says whether a product can take the kernel: the CPU backend, float32 x, 1 to
MAX_SPLIT_ROWS rows (in calls of MAX_ROWS), and a build and CPU with AMX-INT8 that the OS lets the process
use (`available`: Sapphire Rapids and later Xeons). Elsewhere callers take
`q8_matmul`. No gradient: the target is frozen.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import build

Array = jax.Array

KERNEL = 'q8_amx'
TARGET = 'specjax_q8_amx_matmul_f32'
OFFSET_TARGET = 'specjax_q8_amx_offset_matmul_f32'   # w = q * scale - offset
SUPPORTED_TARGET = 'specjax_q8_amx_supported'
TILE = 16        # outputs per tile
MAX_ROWS = 64    # rows of x a call takes (a verify call over 9 positions at batch 4 is 36)
# Rows a product takes the kernel for, in calls of MAX_ROWS: a row's bits do not depend on the
# other rows, so a verify call of a large batch (16 rows x 9 positions) gets the bits its
# decode steps get, where XLA's float32 product would round differently (and took 9 decode
# steps for 16 x 5 on a 2-core Xeon). Past this, a prefill's many rows, XLA's product.
MAX_SPLIT_ROWS = 4 * MAX_ROWS
BLOCK_SIZES = (16, 32)


@functools.cache
def available() -> bool:
  """Whether the kernel is built and registered, and this CPU and OS let it use AMX-INT8."""
  return build.supported(KERNEL, (TARGET, OFFSET_TARGET, SUPPORTED_TARGET), SUPPORTED_TARGET)


def applies(num_rows: int, x: Array) -> bool:
  return (jax.default_backend() == 'cpu' and 1 <= num_rows <= MAX_SPLIT_ROWS
          and x.dtype == jnp.float32 and available())


def tile_form(q_OxI: np.ndarray, scale_OxB: np.ndarray, offset_OxB: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
  """(tiles int8 [O / 16, I * 16], scale float32 [O / 16, I / B * 16], offset like scale or
  None) of a matrix's int8 form (`q8_weights.Form`), or None where O is not a multiple of 16,
  I of 4 or B not in BLOCK_SIZES. Row t of tiles is [I / 4][16][4]: inputs 4k..4k+3 of
  outputs 16t..16t+15; row t of scale is [I / B][16]."""
  q_OxI, scale_OxB = np.asarray(q_OxI), np.asarray(scale_OxB, np.float32)
  o, i = q_OxI.shape
  blocks = scale_OxB.shape[1]
  if o % TILE or i % 4 or not blocks or i % blocks or i // blocks not in BLOCK_SIZES:
    return None
  t = o // TILE
  tiles = np.ascontiguousarray(
      q_OxI.astype(np.int8).reshape(t, TILE, i // 4, 4).transpose(0, 2, 1, 3)).reshape(t, i * TILE)

  def by_tile(a_OxB):
    return np.ascontiguousarray(np.asarray(a_OxB, np.float32).reshape(t, TILE, blocks)
                                .transpose(0, 2, 1)).reshape(t, blocks * TILE)
  return tiles, by_tile(scale_OxB), None if offset_OxB is None else by_tile(offset_OxB)


def q8_amx_matmul(x_NxI: Array, tiles: Array, scale: Array, offset: Array | None = None
                  ) -> Array:
  """y[N, O] = x @ w.T, w given by its `tile_form`; call only where `applies` holds."""
  if not available():
    raise build.KernelBuildError(
        f'the {KERNEL} CPU kernel is not available here (needs a build and CPU with AMX-INT8): '
        'check `applies` first')
  operands = [x_NxI, tiles, scale] + ([] if offset is None else [offset])
  ok = (np.ndim(x_NxI) == 2 and np.ndim(tiles) == 2 and np.ndim(scale) == 2
        and x_NxI.dtype == jnp.float32 and tiles.dtype == jnp.int8
        and scale.dtype == jnp.float32 and tiles.shape[0] == scale.shape[0]
        and tiles.shape[1] == x_NxI.shape[1] * TILE and scale.shape[1] % TILE == 0
        and scale.shape[1] and x_NxI.shape[1] % (scale.shape[1] // TILE) == 0
        and x_NxI.shape[1] // (scale.shape[1] // TILE) in BLOCK_SIZES
        and (offset is None or (offset.shape == scale.shape and offset.dtype == jnp.float32)))
  if not ok:
    raise ValueError('q8_amx_matmul: expected float32 x[N, I], int8 tiles[O / 16, I * 16], '
                     f'float32 scale[O / 16, I / B * 16] (and an offset like scale), B in '
                     f'{BLOCK_SIZES}; got '
                     + ', '.join(f'{a.dtype}{list(a.shape)}' for a in operands))
  if x_NxI.shape[0] > MAX_ROWS:   # calls of MAX_ROWS rows (see MAX_SPLIT_ROWS)
    return jnp.concatenate([q8_amx_matmul(x_NxI[n:n + MAX_ROWS], tiles, scale, offset)
                            for n in range(0, x_NxI.shape[0], MAX_ROWS)])
  out = jax.ShapeDtypeStruct((x_NxI.shape[0], tiles.shape[0] * TILE), jnp.float32)
  target = TARGET if offset is None else OFFSET_TARGET
  return jax.ffi.ffi_call(target, out, vmap_method='sequential')(*operands)
