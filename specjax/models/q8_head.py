"""The tied head served from its Q8_0 form: the same weights, read at a quarter of the bytes.

The embedded Gemma 3 270M's GGUF stores its 262,144 x 640 embedding as Q8_0
(an int8 per weight and a float16 scale per 32), and the head is 63% of what a
decode step reads: 671 MB dequantized to float32. Every Q8_0 weight is exact
in float32 (a float16 times an int8 has at most 19 significant bits), so the
dequantized table can be split back into int8 values and float32 scales, bit
for bit, and multiplied from those by `cpu_kernels/q8_matmul` (189 MB a step):
the same model, and the same products as `cpu_kernels/skinny_matmul` over the
float32 table, bit for bit.

`with_q8_head(params)` adds that form beside the float32 table (which the
embedding lookup and the drafters keep reading) as two more parameters,
`HEAD_Q8` and `HEAD_SCALE`, when the run is on CPU, the kernel is built and
every block of the table checks out; `gemma.head_logits` then takes the kernel
for 1 to `q8_matmul.MAX_ROWS` rows. Any other table (a float16 or bfloat16
checkpoint, Q4_K, a trained one) fails the check in its first blocks and is
served as before. The check is exact, not a tolerance: scale = max|w| / 127
per block, q = w / scale, and q * scale must give back every weight's bits.
"""

from __future__ import annotations

from typing import Any

from absl import logging
import jax
import numpy as np

from specjax.cpu_kernels import q8_matmul

HEAD_Q8 = 'head_q8_VxD'
HEAD_SCALE = 'head_scale_VxB'
_ROWS_PER_CHUNK = 8192  # 21 MB of float32 at a time


def q8_form(table_VxD: Any) -> tuple[np.ndarray, np.ndarray] | None:
  """(int8 q[V, D], float32 scale[V, D / 32]) with q * scale == table exactly, or None.

  None as soon as one block is not exactly an int8 multiple of its scale (or D
  is not a multiple of 32). About 1 s for the 270M's table on 2 cores.
  """
  if np.ndim(table_VxD) != 2 or np.shape(table_VxD)[1] % q8_matmul.BLOCK:
    return None
  num_rows, width = np.shape(table_VxD)
  blocks = width // q8_matmul.BLOCK
  q_VxD = np.empty((num_rows, width), np.int8)
  scale_VxB = np.empty((num_rows, blocks), np.float32)
  for start in range(0, num_rows, _ROWS_PER_CHUNK):
    rows = slice(start, min(start + _ROWS_PER_CHUNK, num_rows))
    w = np.asarray(table_VxD[rows], np.float32).reshape(-1, blocks, q8_matmul.BLOCK)
    if not np.all(np.isfinite(w)):
      return None
    scale = np.abs(w).max(axis=2) / np.float32(127)
    q = np.rint(w / np.where(scale == 0, np.float32(1), scale)[..., None])
    if not (np.all(np.abs(q) <= 127) and np.array_equal(q * scale[..., None], w)):
      return None
    q_VxD[rows] = q.astype(np.int8).reshape(-1, width)
    scale_VxB[rows] = scale
  return q_VxD, scale_VxB


def with_q8_head(params: dict[str, Any]) -> dict[str, Any]:
  """`params` with the head's Q8_0 form added where it serves (see the module doc), else as is."""
  if jax.default_backend() != 'cpu' or HEAD_Q8 in params:
    return params
  table_VxD = params['embedding_VxD']
  if np.dtype(table_VxD.dtype) != np.float32 or not q8_matmul.available():
    return params
  form = q8_form(table_VxD)
  if form is None:
    logging.info('the tied head is not exactly Q8_0: it is served from its float32 table')
    return params
  logging.info('serving the tied head from its Q8_0 form (%.0f MB instead of %.0f MB a step)',
               (form[0].nbytes + form[1].nbytes) / 1e6, 4 * np.prod(np.shape(table_VxD)) / 1e6)
  return {**params, HEAD_Q8: form[0], HEAD_SCALE: form[1]}
