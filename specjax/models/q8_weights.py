"""Matrices served from int8 values and a float32 scale per 32 weights: the same weights, fewer bytes.

The embedded Gemma 3 270M's GGUF stores its tied 262,144 x 640 table as Q8_0
(an int8 and a float16 scale per 32 weights) and its layers' query, key, gate
and up projections as Q5_0 (a 5-bit integer minus 16, and a float16 scale per
32). Both are exact in float32: a float16 times an integer of at most 8 bits
has at most 19 significant bits. So each dequantized float32 matrix can be
split back into int8 values and float32 scales, bit for bit, and multiplied
from those by `cpu_kernels/q8_matmul`, which rebuilds every weight in a
register just before it is used: the same model, and the same sums as
`cpu_kernels/skinny_matmul` over the float32 matrix, bit for bit. A decode
step of the 270M then reads 189 MB for the head instead of 671 MB.

`with_q8_weights(params)` adds each split matrix's form beside it (the float32
matrix stays: the embedding lookup, the drafters and the XLA paths read it) as
`<name>_q8` (int8, the matrix's shape) and `<name>_q8scale` (float32, one
column per 32 weights), when the run is on CPU, the kernel is built and every
block checks out; `gemma.linear` and `gemma.head_logits` then take the kernel
for 1 to `q8_matmul.MAX_ROWS` rows. The check is exact, not a tolerance: per
block, scale = max|w| / m for the format's largest integer m (127 for Q8_0, 16
for Q5_0, 8 for Q4_0), q = w / scale, and q * scale must give back every
weight's bits. Any other matrix (float16 or bfloat16 weights, Q4_K or Q6_K,
whose weights carry an offset or 16-weight blocks, a trained one) fails it in
its first blocks and is served in float32 as before. Only matrices split over
the 'model' mesh axis by their rows are considered (the head and the q, k, v,
gate and up projections), so a shard's rows are whole blocks on any mesh.
"""

from __future__ import annotations

from typing import Any

from absl import logging
import jax
import numpy as np

from specjax.cpu_kernels import q8_matmul

Q8_SUFFIX = '_q8'
SCALE_SUFFIX = '_q8scale'
# Matrices split into blocks along their input, and over the mesh by their rows.
SPLITTABLE = ('embedding_VxD', 'q_NHxD', 'k_KHxD', 'v_KHxD', 'gate_FxD', 'up_FxD')
# The largest integer of each format: Q8_0, Q5_0 (q - 16 in [-16, 15]), Q4_0 (q - 8).
_LARGEST_INTEGERS = (127, 16, 8)
HEAD_FORM = 'embedding_VxD' + Q8_SUFFIX  # present when the tied head is served from int8
HEAD_SCALE = 'embedding_VxD' + SCALE_SUFFIX
_ROWS_PER_CHUNK = 8192  # 21 MB of float32 at a time for the head


def _split_rows(w_RxBxK: np.ndarray, largest: int) -> tuple[np.ndarray, np.ndarray] | None:
  scale_RxB = np.abs(w_RxBxK).max(axis=2) / np.float32(largest)
  q = np.rint(w_RxBxK / np.where(scale_RxB == 0, np.float32(1), scale_RxB)[..., None])
  if not (np.all(np.abs(q) <= 127) and np.array_equal(q * scale_RxB[..., None], w_RxBxK)):
    return None
  return q.astype(np.int8), scale_RxB


def split(matrix_OxI: Any) -> tuple[np.ndarray, np.ndarray] | None:
  """(int8 q[O, I], float32 scale[O, I / 32]) with q * scale == matrix exactly, or None.

  Tries each format's largest integer on the first rows, then splits the rest
  with the one that fits. About 1 s for the 270M's head on 2 cores.
  """
  if np.ndim(matrix_OxI) != 2 or np.shape(matrix_OxI)[1] % q8_matmul.BLOCK:
    return None
  num_rows, width = np.shape(matrix_OxI)
  blocks = width // q8_matmul.BLOCK

  def rows(start):
    w = np.asarray(matrix_OxI[start:start + _ROWS_PER_CHUNK], np.float32)
    return w.reshape(-1, blocks, q8_matmul.BLOCK) if np.all(np.isfinite(w)) else None

  first = rows(0)
  if first is None:
    return None
  for largest in _LARGEST_INTEGERS:
    parts = _split_rows(first, largest)
    if parts is not None:
      break
  else:
    return None
  q_OxI = np.empty((num_rows, width), np.int8)
  scale_OxB = np.empty((num_rows, blocks), np.float32)
  for start in range(0, num_rows, _ROWS_PER_CHUNK):
    if start:
      w = rows(start)
      parts = None if w is None else _split_rows(w, largest)
    if parts is None:
      return None
    q_OxI[start:start + _ROWS_PER_CHUNK] = parts[0].reshape(-1, width)
    scale_OxB[start:start + _ROWS_PER_CHUNK] = parts[1]
  return q_OxI, scale_OxB


def _with_forms(tree: dict[str, Any], names: tuple[str, ...], counts: dict[str, int]
                ) -> dict[str, Any]:
  out = dict(tree)
  for name, value in tree.items():
    if isinstance(value, dict):
      out[name] = _with_forms(value, names, counts)
    elif np.ndim(value) == 2 and not name.endswith((Q8_SUFFIX, SCALE_SUFFIX)):
      nbytes = np.dtype(value.dtype).itemsize * int(np.prod(np.shape(value)))
      form = (split(value) if name in names and name + Q8_SUFFIX not in tree
              and np.dtype(value.dtype) == np.float32 else None)
      if form is None:
        counts['bytes kept'] += nbytes
        continue
      counts['bytes split'] += nbytes
      out[name + Q8_SUFFIX], out[name + SCALE_SUFFIX] = form
      counts['split'] += 1
      counts['q8 bytes'] += form[0].nbytes + form[1].nbytes
  return out


def with_q8_weights(params: dict[str, Any], names: tuple[str, ...] = SPLITTABLE
                    ) -> dict[str, Any]:
  """`params` with the int8 form of every matrix named in `names` (of SPLITTABLE) added where
  it serves (see the module doc), else `params` itself."""
  if set(names) - set(SPLITTABLE):
    raise ValueError(f'only {SPLITTABLE} are split, not {sorted(set(names) - set(SPLITTABLE))}')
  if jax.default_backend() != 'cpu' or not q8_matmul.available():
    return params
  counts = {'split': 0, 'bytes split': 0, 'bytes kept': 0, 'q8 bytes': 0}
  out = _with_forms(params, tuple(names), counts)
  if not counts['split']:
    logging.info('no matrix of this model is exactly int8 blocks: all are served as they are')
    return params
  logging.info('serving %d matrices from their int8 blocks: %.0f MB a step instead of %.0f MB '
               '(%.0f MB of other matrices as they are)', counts['split'],
               counts['q8 bytes'] / 1e6, counts['bytes split'] / 1e6, counts['bytes kept'] / 1e6)
  return out
