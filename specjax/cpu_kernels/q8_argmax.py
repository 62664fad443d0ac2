"""The argmax of a tied head's logits, from its int8 blocks, without the logits: greedy's token.

Greedy decoding and greedy verification need, at each scored position, only
the index of the largest logit. `q8_argmax.cc` finds it exactly (the first
index of the maximum of `q8_matmul`'s product, and that maximum, bit for bit)
in two passes: integer dot products against int8-rounded activations, with a
rigorous bound on their error, leave a handful of candidate rows; only those
get the exact float32 sum. The first pass is 64 int8 products an instruction
(AVX-512 VNNI) where `q8_matmul` does 16 float32 ones, so at 5 or 9 positions
the head costs about what reading it once does; with AVX2 alone, 32 int8
products in four instructions where `q8_matmul` does 8 float32 ones in one,
with the same bound. See the .cc file for the bound.

The head needs a second layout for it (`tile_form`, made at load beside the
form: the same 168 MB for the 270M, plus its scales again and a float a row).
`applies` says whether a call can take it: the CPU backend, float32 x, 1 to
MAX_ROWS rows, and a build with AVX-512 VNNI or AVX2 (`available`). Elsewhere callers
take the logits and their argmax, which give the same token.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.cpu_kernels import build

Array = jax.Array

KERNEL = 'q8_argmax'
TARGET = 'specjax_q8_argmax_f32'
SUPPORTED_TARGET = 'specjax_q8_argmax_supported'
SCREEN_TARGET = 'specjax_q8_argmax_screen_f32'
SCREEN_SUPPORTED_TARGET = 'specjax_q8_argmax_screen_supported'
_TARGETS = (TARGET, SUPPORTED_TARGET, SCREEN_TARGET, SCREEN_SUPPORTED_TARGET)
TILE = 16        # head rows per tile
# Positions a call scores: a verify call over 9 at batch 16 is 144, and each row's answer is
# exact whatever the others (past it, a prefill's rows, the logits and their argmax).
MAX_ROWS = 256


@functools.cache
def available() -> bool:
  """Whether the kernel is built, registered and has its fast path (AVX-512 VNNI, or AVX2)."""
  return build.supported(KERNEL, _TARGETS, SUPPORTED_TARGET)


@functools.cache
def screen_available() -> bool:
  """Whether the AMX screen is built and this CPU and OS let it use AMX-INT8 (Sapphire
  Rapids and later Xeons)."""
  return available() and build.supported(KERNEL, _TARGETS, SCREEN_SUPPORTED_TARGET)


def applies(num_rows: int, x: Array) -> bool:
  return (jax.default_backend() == 'cpu' and 1 <= num_rows <= MAX_ROWS
          and x.dtype == jnp.float32 and available())


def tile_form(q_OxI: np.ndarray, scale_OxB: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
  """(tiles uint8 [O / 16, I * 16], tile_scale float32 [O / 16, I / B * 16], l1max float32
  [O / 16, 16]) of a head's int8 form (no offset), or None where O is not a multiple of 16."""
  q_OxI, scale_OxB = np.asarray(q_OxI), np.asarray(scale_OxB, np.float32)
  o, i = q_OxI.shape
  blocks = scale_OxB.shape[1]
  if o % TILE or i % 4 or i % blocks:
    return None
  t = o // TILE
  # [T, 16, I/4, 4] -> [T, I/4, 16, 4], as unsigned q + 128.
  tiles = (q_OxI.reshape(t, TILE, i // 4, 4).transpose(0, 2, 1, 3).astype(np.int16) + 128
           ).astype(np.uint8).reshape(t, i * TILE)
  tile_scale = scale_OxB.reshape(t, TILE, blocks).transpose(0, 2, 1).reshape(t, blocks * TILE)
  abs_sums = np.abs(q_OxI.reshape(o, blocks, i // blocks).astype(np.int32)).sum(-1)
  l1_OxB = abs_sums.astype(np.float64) * scale_OxB
  # Rounded up into float32, so the bound stays a bound.
  l1max = np.nextafter(l1_OxB.max(axis=1).astype(np.float32), np.float32(np.inf))
  return tiles, np.ascontiguousarray(tile_scale), l1max.reshape(t, TILE)


def screen_form(q_OxI: np.ndarray, scale_OxB: np.ndarray, rows_per_chunk: int = 8192
                ) -> tuple[np.ndarray, np.ndarray] | None:
  """(screen int8 [O / 16, I * 16], meta float32 [O / 16, 48]) of a head's int8 form (no
  offset) for `screen_argmax`, or None where O is not a multiple of 16 or I of 64. The
  weights w = q * scale (float32, as q8_matmul rebuilds them) rounded to int8 with one scale
  a row, s = max|w| / 127, in the tile layout [I / 4][16][4]; meta holds, per tile,
  the 16 rows' s, l1 = sum |w| and err = max |w - s * screen|, the last two rounded up."""
  q_OxI, scale_OxB = np.asarray(q_OxI), np.asarray(scale_OxB, np.float32)
  o, i = q_OxI.shape
  blocks = scale_OxB.shape[1]
  if o % TILE or i % 64 or not blocks or i % blocks:
    return None
  screen = np.empty((o, i), np.int8)
  meta = np.empty((3, o), np.float32)
  for r0 in range(0, o, rows_per_chunk):
    r1 = min(o, r0 + rows_per_chunk)
    w = (q_OxI[r0:r1].astype(np.float32).reshape(r1 - r0, blocks, -1)
         * scale_OxB[r0:r1, :, None]).reshape(r1 - r0, i).astype(np.float64)
    s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
    safe = np.where(s > 0, s, 1).astype(np.float64)[:, None]
    r = np.clip(np.rint(w / safe), -127, 127)
    screen[r0:r1] = r
    meta[0, r0:r1] = s
    meta[1, r0:r1] = _round_up(np.abs(w).sum(axis=1))
    meta[2, r0:r1] = _round_up(np.abs(w - s.astype(np.float64)[:, None] * r).max(axis=1))
  t = o // TILE
  tiles = np.ascontiguousarray(
      screen.reshape(t, TILE, i // 4, 4).transpose(0, 2, 1, 3)).reshape(t, i * TILE)
  return tiles, np.ascontiguousarray(meta.reshape(3, t, TILE).transpose(1, 0, 2)).reshape(
      t, 3 * TILE)


def _round_up(v: np.ndarray) -> np.ndarray:
  """float32 of float64 v >= 0, rounded up: a bound stays a bound."""
  f = v.astype(np.float32)
  return np.where(f.astype(np.float64) >= v, f, np.nextafter(f, np.float32(np.inf)))


def head_argmax(x_NxI: Array, tiles: Array, tile_scale: Array, l1max: Array, q_OxI: Array,
                scale_OxB: Array) -> tuple[Array, Array]:
  """(int32 [N] index, float32 [N] value) of each row's largest logit x @ w.T, w the head
  given as its int8 form (q, scale) and that form's `tile_form`."""
  if not available():
    raise RuntimeError('the q8_argmax kernel is not available here (needs the CPU backend and '
                       'a build with AVX-512 VNNI or AVX2): check `applies` first')
  n = x_NxI.shape[0]
  call = jax.ffi.ffi_call(TARGET, (jax.ShapeDtypeStruct((n,), jnp.int32),
                                   jax.ShapeDtypeStruct((n,), jnp.float32)))
  return call(x_NxI, tiles, tile_scale, l1max, q_OxI, scale_OxB)


def screen_argmax(x_NxI: Array, screen: Array, meta: Array, q_OxI: Array, scale_OxB: Array
                  ) -> tuple[Array, Array]:
  """`head_argmax`'s answer, bit for bit, from the AMX screen: `screen_form`'s table for the
  first pass (one tile product per 64 inputs, no per-block sums), the form for the exact
  second; call only where `screen_available`."""
  if not screen_available():
    raise RuntimeError('the q8_argmax AMX screen is not available here (needs the CPU backend '
                       'and a CPU with AMX-INT8): check `screen_available` first')
  n = x_NxI.shape[0]
  call = jax.ffi.ffi_call(SCREEN_TARGET, (jax.ShapeDtypeStruct((n,), jnp.int32),
                                          jax.ShapeDtypeStruct((n,), jnp.float32)))
  return call(x_NxI, screen, meta, q_OxI, scale_OxB)
