"""Matrices served from int8 values and a float32 scale per block: the same weights, fewer bytes.

The embedded Gemma 3 270M's GGUF stores its weights as integers times a
float16 scale per block:
  Q8_0  the tied 262,144 x 640 table and half the v projections: an int8 per
        weight, a scale per 32;
  Q5_0  the q, k, gate and up projections and the other v: a 5-bit integer
        minus 16, a scale per 32;
  Q4_K  the o projections and half the down projections: a 4-bit integer
        times a scale, minus an offset, per 32 (the scale and the offset each a
        float16 super-block scale times a 6-bit integer);
  Q6_K  the other down projections: a 6-bit integer minus 32 times a scale per
        16 (a float16 times an int8).
Each is exact in float32 (a float16 times small integers has at most 24
significant bits), so each dequantized float32 matrix can be split back into
int8 values, float32 scales (and offsets), value for value, and multiplied
from those by `cpu_kernels/q8_matmul`, which rebuilds every weight in a
register just before it is used: the same model, and the same sums as
`cpu_kernels/skinny_matmul` over the float32 matrix, bit for bit. A decode
step of the 270M then reads about 300 MB instead of 1.07 GB.

`with_q8_weights(params)` adds each split matrix's form beside it (the float32
matrix stays: the embedding lookup, the drafters and the XLA paths read it) as
`<name>_q8` (int8, the matrix's shape), `<name>_q8scale` (float32, a column
per block) and, for a form with offsets, `<name>_q8offset`, when the run is on
CPU, the kernel is built and every block checks out; `gemma.linear` and
`gemma.head_logits` then take the kernel for 1 to `q8_matmul.MAX_ROWS` rows.

The check is exact, not a tolerance. `split` tries three forms in turn: a
scale per 32 weights, a scale per 16, a scale and an offset per 32. For a
block of a scaled form it tries scale = max|w| / m for the format's largest
integer m (127 for Q8_0, 16 for Q5_0, 8 for Q4_0, 32 and below for Q6_K),
q = w / scale, and keeps the first for which q * scale gives back every
weight's value. For the offset form it tries spans of 15 and below from the
block's least to its greatest weight, with the scale and offset rounded to the
17 significant bits a float16 times a 6-bit integer has, and keeps the first
for which q * scale is exact and q * scale - offset gives back every weight.
Any other matrix (float16 or bfloat16 weights, a trained one) fails in its
first rows and is served in float32 as before.
"""

from __future__ import annotations

from concurrent import futures
import os
from typing import Any, Callable, NamedTuple

from absl import logging
import jax
import numpy as np

from specjax.cpu_kernels import q8_amx
from specjax.cpu_kernels import q8_argmax
from specjax.cpu_kernels import q8_matmul

Q8_SUFFIX = '_q8'
SCALE_SUFFIX = '_q8scale'
OFFSET_SUFFIX = '_q8offset'
FORM_SUFFIXES = (Q8_SUFFIX, SCALE_SUFFIX, OFFSET_SUFFIX)
# The matrices tried: blocks run along a matrix's input, each of its rows whole.
SPLITTABLE = ('embedding_VxD', 'q_NHxD', 'k_KHxD', 'v_KHxD', 'o_DxNH', 'gate_FxD', 'up_FxD',
              'down_DxF')
# Of those, the ones split over the mesh's 'model' axis by their input (sharding.py): a shard
# must hold whole blocks.
SPLIT_BY_INPUT = ('o_DxNH', 'down_DxF')
HEAD_FORM = 'embedding_VxD' + Q8_SUFFIX  # present when the tied head is served from int8
HEAD_SCALE = 'embedding_VxD' + SCALE_SUFFIX
# The head's form again in the tile layout of `cpu_kernels/q8_argmax` (greedy's argmax without
# the logits), where that kernel is built: split over the 'model' axis like the table's rows.
# The q, k, v, o, gate, up and down matrices' forms again in the tile layout of
# `cpu_kernels/q8_amx` (Intel AMX's tile products), where that kernel is available; split like
# the matrix (a row of tiles holds 16 outputs, its columns run along the input).
AMX_SUFFIXES = ('_q8amxtiles', '_q8amxscale', '_q8amxoffset')   # q8_amx's operands, in order
TILE_SUFFIXES = ('_q8amxoffset', '_q8amxscale', '_q8amxtiles', '_q8screenmeta', '_q8screen',
                 '_q8tilescale', '_q8tiles', '_q8l1max')   # longest first: see `base_name`
HEAD_TILES = 'embedding_VxD_q8tiles'
HEAD_TILE_SCALE = 'embedding_VxD_q8tilescale'
HEAD_L1MAX = 'embedding_VxD_q8l1max'
HEAD_TILE_ARRAYS = (HEAD_TILES, HEAD_TILE_SCALE, HEAD_L1MAX)   # q8_argmax's operands, in order
# Where the CPU has AMX-INT8, the head's screen table for `q8_argmax.screen_argmax` instead
# (`q8_argmax.screen_form`: the same 168 MB for the 270M, and 3 floats a row).
HEAD_SCREEN = 'embedding_VxD_q8screen'
HEAD_SCREEN_META = 'embedding_VxD_q8screenmeta'
HEAD_SCREEN_ARRAYS = (HEAD_SCREEN, HEAD_SCREEN_META)   # screen_argmax's operands, in order


class HeadArgmaxKind(NamedTuple):
  """A form of the head for greedy's argmax kernel: its arrays' names (the kernel's operands
  before the head's q and scale), whether this build and CPU serve it, how it is made from
  the head's int8 form (None where it does not fit), and the kernel's entry point."""
  names: tuple[str, ...]
  available: Callable[[], bool]
  make: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, ...] | None]
  call: Callable[..., Any]


# Preferred first: the AMX screen, then the VNNI pass's tiles (AVX-512 VNNI, or AVX2).
HEAD_ARGMAX_KINDS = (
    HeadArgmaxKind(HEAD_SCREEN_ARRAYS, q8_argmax.screen_available, q8_argmax.screen_form,
                   q8_argmax.screen_argmax),
    HeadArgmaxKind(HEAD_TILE_ARRAYS, q8_argmax.available, q8_argmax.tile_form,
                   q8_argmax.head_argmax))
_HEAD_OFFSET = 'embedding_VxD' + OFFSET_SUFFIX
_ROWS_PER_CHUNK = 8192  # 21 MB of float32 at a time for the head
_PROBE_ROWS = 8  # rows a form must fit before the rest of the matrix is tried


class Form(NamedTuple):
  """A matrix as int8 blocks: w = q * scale[:, i // B] (- offset[:, i // B])."""
  q: np.ndarray                # int8 [O, I]
  scale: np.ndarray            # float32 [O, I / B]
  offset: np.ndarray | None    # float32 [O, I / B], or None


# (weights per block, with an offset): a scale per 32 (Q8_0, Q5_0, Q4_0), per 16 (Q6_K), and
# a scale and an offset per 32 (Q4_K).
_FORMS = ((32, False), (16, False), (32, True))
# Largest integers of a scaled block: Q8_0's, Q5_0's (q - 16 in [-16, 15]), Q4_0's, then all
# from 32 down (Q6_K's q - 32 in [-32, 31], whose largest magnitude in a block varies).
_SCALED_LARGEST = (127, 16, 8) + tuple(range(32, 0, -1))
# (span from the least to the greatest q, the least q) of an offset block: Q4_K's q is in
# [0, 15] and its least weight usually q = 0.
_OFFSET_SPANS = tuple((span, least) for span in range(15, 0, -1) for least in (0, 1, 2))


def _round_to_bits(x: np.ndarray, bits: int) -> np.ndarray:
  mantissa, exponent = np.frexp(x)
  return np.ldexp(np.rint(mantissa * 2.0 ** bits) / 2.0 ** bits, exponent)


def _split_scaled(w_NxK: np.ndarray, largest: tuple[int, ...] = _SCALED_LARGEST
                  ) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
  """(q, scale, the largest integers that served, most blocks first) for blocks w_NxK (one
  block a row) with q * scale == w, or None. `largest`: the integers to try, in order."""
  q_NxK = np.zeros(w_NxK.shape, np.int8)
  scale_N = np.zeros(len(w_NxK), np.float32)
  largest_N = np.abs(w_NxK).max(axis=1).astype(np.float64)
  todo = np.nonzero(largest_N > 0)[0]  # an all-zero block is q = 0, scale = 0
  served = {}
  for m in largest:
    if not len(todo):
      break
    w = w_NxK if len(todo) == len(w_NxK) else w_NxK[todo]
    s = (largest_N[todo] / m).astype(np.float32)
    q = np.rint(w / s[:, None])
    ok = np.all(np.abs(q) <= 127, axis=1) & np.all(q.astype(np.float32) * s[:, None] == w, axis=1)
    if ok.any():
      q_NxK[todo[ok]], scale_N[todo[ok]] = q[ok], s[ok]
      served[m] = int(ok.sum())
      todo = todo[~ok]
  if len(todo):
    return None
  return q_NxK, scale_N, sorted(served, key=served.get, reverse=True)


def _split_offset(w_NxK: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
  """(q, scale, offset) for blocks w_NxK with q * scale exact in float32 and
  q * scale - offset == w, or None."""
  q_NxK = np.zeros(w_NxK.shape, np.int8)
  scale_N = np.zeros(len(w_NxK), np.float32)
  offset_N = np.zeros(len(w_NxK), np.float32)
  w64_NxK = w_NxK.astype(np.float64)
  least_N, greatest_N = w64_NxK.min(axis=1), w64_NxK.max(axis=1)
  flat = least_N == greatest_N  # one value: q = 0, offset = -w
  offset_N[flat] = -w_NxK[flat, 0]
  todo = np.nonzero(~flat)[0]
  for span, least_q in _OFFSET_SPANS:
    if not len(todo):
      break
    s = _round_to_bits((greatest_N[todo] - least_N[todo]) / span, 17).astype(np.float32)
    b = _round_to_bits(s.astype(np.float64) * least_q - least_N[todo], 17).astype(np.float32)
    q = np.rint((w64_NxK[todo] + b[:, None]) / s[:, None])
    product = q * s[:, None].astype(np.float64)
    ok = (np.all(np.abs(q) <= 127, axis=1)
          & np.all(product == product.astype(np.float32), axis=1)
          & np.all(product.astype(np.float32) - b[:, None] == w_NxK[todo], axis=1))
    q_NxK[todo[ok]], scale_N[todo[ok]], offset_N[todo[ok]] = q[ok], s[ok], b[ok]
    todo = todo[~ok]
  return None if len(todo) else (q_NxK, scale_N, offset_N)


def _split_rows(w_RxI: np.ndarray, block: int, with_offset: bool,
                largest: tuple[int, ...] = _SCALED_LARGEST) -> tuple[Form, list[int]] | None:
  """The rows' form, and for a scaled one the largest integers that served (most first)."""
  if not np.all(np.isfinite(w_RxI)):
    return None
  rows, width = w_RxI.shape
  w_NxK = w_RxI.reshape(-1, block)
  parts = _split_offset(w_NxK) if with_offset else _split_scaled(w_NxK, largest)
  if parts is None:
    return None
  q, scale, offset = (parts[0], parts[1], parts[2] if with_offset else None)
  reshape = lambda a: None if a is None else a.reshape(rows, width // block)  # noqa: E731
  return Form(q.reshape(rows, width), reshape(scale), reshape(offset)), (
      [] if with_offset else parts[2])


def split(matrix_OxI: Any) -> Form | None:
  """The matrix as int8 blocks (`Form`), value for value, or None.

  Tries each form on the first rows, then splits the rest with the first that
  fits, trying first the largest integers that served those rows, in chunks
  on every core (numpy releases the GIL). About 1 s for the 270M's head on 2
  cores.
  """
  if np.ndim(matrix_OxI) != 2 or np.dtype(getattr(matrix_OxI, 'dtype', None)) != np.float32:
    return None
  # On the host before any thread slices it: a device array's slice is a jitted op, and two
  # threads taking their first slice of one shape at once each compile it (JAX does not
  # wait for a compile in flight), a program written twice to the persistent cache.
  matrix_OxI = np.asarray(matrix_OxI)
  num_rows, width = np.shape(matrix_OxI)
  for block, with_offset in _FORMS:
    if width % block:
      continue
    probe = _split_rows(np.asarray(matrix_OxI[:_PROBE_ROWS]), block, with_offset)
    if probe is None:
      continue
    largest = tuple(probe[1]) + tuple(m for m in _SCALED_LARGEST if m not in probe[1])

    def chunk(start, block=block, with_offset=with_offset, largest=largest):
      return _split_rows(np.asarray(matrix_OxI[start:start + _ROWS_PER_CHUNK], np.float32),
                         block, with_offset, largest)

    starts = range(0, num_rows, _ROWS_PER_CHUNK)
    if len(starts) == 1:
      chunks = [chunk(0)]
    else:
      with futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        chunks = list(pool.map(chunk, starts))
    if any(c is None for c in chunks):
      continue
    if len(chunks) == 1:
      return chunks[0][0]
    return Form(*(None if parts[0] is None else np.concatenate(parts)
                  for parts in zip(*(c[0] for c in chunks))))
  return None


def _matrices(tree: dict[str, Any], names: tuple[str, ...], path=()):
  """(path, name, matrix, whether to split it) for every matrix of the tree."""
  for name, value in tree.items():
    if isinstance(value, dict):
      yield from _matrices(value, names, path + (name,))
    elif np.ndim(value) == 2 and base_name(name) == name:
      yield path, name, value, name in names and name + Q8_SUFFIX not in tree


def base_name(name: str) -> str:
  """The matrix a form's array belongs to ('o_DxNH_q8scale' -> 'o_DxNH'), else `name`."""
  for suffix in TILE_SUFFIXES + FORM_SUFFIXES[::-1]:
    if name.endswith(suffix):
      return name[:-len(suffix)]
  return name


def _leaf_name(path: tuple[str, ...], name: str) -> str:
  """A matrix's dotted leaf name ('layer_0.attn.q_NHxD'), as checkpoints spell it."""
  return '.'.join(path + (name,))


def _stored_form(forms: dict[str, np.ndarray], path: tuple[str, ...], name: str) -> Form | None:
  leaf = _leaf_name(path, name)
  if leaf + Q8_SUFFIX not in forms:
    return None
  return Form(forms[leaf + Q8_SUFFIX], forms[leaf + SCALE_SUFFIX],
              forms.get(leaf + OFFSET_SUFFIX))


def _check_stored(params: dict[str, Any], forms: dict[str, np.ndarray]) -> None:
  """Stored forms must belong to these params: each names a matrix and has its shape."""
  matrices = {_leaf_name(path, name): value for path, name, value, _ in
              _matrices(params, SPLITTABLE)}
  for key, part in forms.items():
    leaf = base_name(key)
    suffix = key[len(leaf):]
    matrix = matrices.get(leaf)
    rows_cols = None if matrix is None else np.shape(matrix)
    if suffix in TILE_SUFFIXES:
      ok = matrix is not None and np.ndim(part) == 2 and np.shape(part)[0] * 16 == rows_cols[0]
    else:
      ok = (matrix is not None and suffix and np.shape(part)[0] == rows_cols[0]
            and (np.shape(part) == rows_cols if suffix == Q8_SUFFIX
                 else np.ndim(part) == 2 and rows_cols[1] % max(np.shape(part)[1], 1) == 0))
    if not ok:
      raise ValueError(f'stored int8 form {key!r} (shape {np.shape(part)}) belongs to no '
                       f'matrix of these params: the forms were made for another checkpoint')


def all_forms(params: dict[str, Any], names: tuple[str, ...] = SPLITTABLE
              ) -> dict[str, np.ndarray]:
  """The form of every matrix named in `names` that splits, flat: dotted leaf name plus
  suffix -> array (what `with_q8_weights(forms=)` takes; a matrix absent has no form), and
  where `q8_argmax` is built the head's tile layout (`HEAD_TILE_ARRAYS`, or with AMX-INT8
  its screen table, `HEAD_SCREEN_ARRAYS`), where `q8_amx` is the layer matrices'
  (`AMX_SUFFIXES`). The loader keeps them in the weight cache
  (`weight_cache.derived_arrays`): splitting the 270M takes 2.1 s, reading them back 0.3 s."""
  matrices = [m for m in _matrices(params, tuple(names)) if m[3]]
  # The small matrices a thread each (the head's chunks are split on every core by `split`).
  with futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    forms = list(pool.map(lambda m: split(m[2]), matrices))
  flat = {}
  for (path, name, _, _), form in zip(matrices, forms):
    if form is None:
      continue
    for suffix, part in zip(FORM_SUFFIXES, form):
      if part is not None:
        flat[_leaf_name(path, name) + suffix] = part
  if HEAD_FORM in flat and _HEAD_OFFSET not in flat:
    names, arrays = _head_argmax_arrays(flat[HEAD_FORM], flat[HEAD_SCALE])
    flat.update(zip(names, arrays or ()))
  if q8_amx.available():
    for (path, name, _, _), form in zip(matrices, forms):
      if form is not None and (amx := _amx_form(name, form)) is not None:
        flat.update((_leaf_name(path, name) + k, v) for k, v in zip(AMX_SUFFIXES, amx)
                    if v is not None)
  return flat


def _amx_form(name: str, form: Form) -> tuple[np.ndarray, ...] | None:
  """`q8_amx.tile_form` of a layer matrix's form; None for the head (its logits stay
  `q8_matmul`'s, which `q8_argmax` reproduces bit for bit) and where the layout does not fit."""
  if name == 'embedding_VxD':
    return None
  return q8_amx.tile_form(form.q, form.scale, form.offset)


def _stored_amx(stored: dict[str, np.ndarray], leaf: str) -> tuple[np.ndarray, ...] | None:
  if leaf + AMX_SUFFIXES[0] not in stored:
    return None
  return tuple(stored.get(leaf + k) for k in AMX_SUFFIXES)


def _with_forms(tree: dict[str, Any], names: tuple[str, ...], model_shards: int,
                counts: dict[str, int], stored: dict[str, np.ndarray]) -> dict[str, Any]:
  matrices = list(_matrices(tree, names))
  forms = [_stored_form(stored, path, name) if wanted else None
           for path, name, _, wanted in matrices]
  out, copied = dict(tree), {()}
  for (path, name, value, _), form in zip(matrices, forms):
    nbytes = np.dtype(value.dtype).itemsize * int(np.prod(np.shape(value)))
    if form is not None and name in SPLIT_BY_INPUT and form.scale.shape[1] % model_shards:
      counts['unsharded'] += 1
      form = None
    if form is None:
      counts['bytes kept'] += nbytes
      continue
    node = out
    for depth, key in enumerate(path):
      if path[:depth + 1] not in copied:  # a copy, once: the caller's tree is left as it was
        node[key] = dict(node[key])
        copied.add(path[:depth + 1])
      node = node[key]
    counts['bytes split'] += nbytes
    node[name + Q8_SUFFIX], node[name + SCALE_SUFFIX] = form.q, form.scale
    if form.offset is not None:
      node[name + OFFSET_SUFFIX] = form.offset
    if q8_amx.available():
      amx = _stored_amx(stored, _leaf_name(path, name)) or _amx_form(name, form)
      # A matrix split by its output must leave each shard whole rows of tiles (its split by
      # input already leaves each whole blocks: checked above).
      if amx is not None and (name in SPLIT_BY_INPUT or amx[0].shape[0] % model_shards == 0):
        node.update((name + k, v) for k, v in zip(AMX_SUFFIXES, amx) if v is not None)
        counts['amx'] += 1
    counts['split'] += 1
    counts['q8 bytes'] += sum(a.nbytes for a in form if a is not None)
  return out


def _head_argmax_arrays(q: np.ndarray, scale: np.ndarray
                        ) -> tuple[tuple[str, ...], tuple[np.ndarray, ...] | None]:
  """(names, arrays) of the first of `HEAD_ARGMAX_KINDS` served here that fits the head (the
  screen needs a width that is a multiple of 64); arrays None where none does."""
  for kind in HEAD_ARGMAX_KINDS:
    if kind.available() and (arrays := kind.make(q, scale)) is not None:
      return kind.names, arrays
  return (), None


def has_head_argmax_form(params: dict[str, Any]) -> bool:
  return any(kind.names[0] in params for kind in HEAD_ARGMAX_KINDS)


def _with_head_tiles(out: dict[str, Any], model_shards: int,
                     forms: dict[str, np.ndarray]) -> None:
  """Adds the head's form for greedy's argmax kernel (`_head_argmax_arrays`) where the head
  has a form without offsets and the kernel's tiles divide over the model shards."""
  if HEAD_FORM not in out or has_head_argmax_form(out) or _HEAD_OFFSET in out:
    return
  names, arrays = _head_argmax_arrays_stored(forms)
  if arrays is None:   # forms stored by a process without the kernel, or a head split before
    names, arrays = _head_argmax_arrays(out[HEAD_FORM], out[HEAD_SCALE])
  if arrays is None or arrays[0].shape[0] % model_shards:
    return
  out.update(zip(names, arrays))


def _head_argmax_arrays_stored(forms: dict[str, np.ndarray]
                               ) -> tuple[tuple[str, ...], tuple[np.ndarray, ...] | None]:
  """Stored arrays of the first of `HEAD_ARGMAX_KINDS` served here, if any are stored."""
  for kind in HEAD_ARGMAX_KINDS:
    if kind.available() and all(k in forms for k in kind.names):
      return kind.names, tuple(forms[k] for k in kind.names)
  return (), None


def without_head_screen(params: dict[str, Any]) -> dict[str, Any]:
  """`params` with the VNNI pass's tiles for the head in place of the AMX screen's table (to
  compare the two in one process)."""
  out = {k: v for k, v in params.items() if k not in HEAD_SCREEN_ARRAYS}
  if HEAD_SCREEN in params and q8_argmax.available():
    tiles = q8_argmax.tile_form(np.asarray(params[HEAD_FORM]), np.asarray(params[HEAD_SCALE]))
    out.update(zip(HEAD_TILE_ARRAYS, tiles))
  return out


def without_amx(params: dict[str, Any]) -> dict[str, Any]:
  """`params` without `q8_amx`'s tile layouts: its products then go to `q8_matmul` (to compare
  the two kernels in one process)."""
  return {k: without_amx(v) if isinstance(v, dict) else v for k, v in params.items()
          if not k.endswith(AMX_SUFFIXES)}


def serves() -> bool:
  """Whether int8 forms serve this run: on CPU, with the kernel built."""
  return jax.default_backend() == 'cpu' and q8_matmul.available()


def with_q8_weights(params: dict[str, Any], names: tuple[str, ...] = SPLITTABLE,
                    model_shards: int = 1, forms: dict[str, np.ndarray] | None = None
                    ) -> dict[str, Any]:
  """`params` with the int8 form of every matrix named in `names` (of SPLITTABLE) added where
  it serves (see the module doc), else `params` itself. `model_shards`: the size of the
  mesh's 'model' axis the params will be split over; a matrix split by its input whose
  blocks a row do not divide by it keeps its float32 form alone. `forms`: what
  `all_forms(params)` gave for these same params (kept in a cache), used instead of
  splitting again; each form's shape is checked against its matrix."""
  if set(names) - set(SPLITTABLE):
    raise ValueError(f'only {SPLITTABLE} are split, not {sorted(set(names) - set(SPLITTABLE))}')
  if not serves():
    return params
  counts = {'split': 0, 'bytes split': 0, 'bytes kept': 0, 'q8 bytes': 0, 'unsharded': 0,
            'amx': 0}
  if forms is None:
    forms = all_forms(params, names)
  else:
    _check_stored(params, forms)
  out = _with_forms(params, tuple(names), model_shards, counts, forms)
  if counts['unsharded']:
    logging.info('%d matrices split by their input stay float32: their blocks do not divide '
                 'over %d model shards', counts['unsharded'], model_shards)
  if not counts['split']:
    logging.info('no matrix of this model is exactly int8 blocks: all are served as they are')
    return params
  _with_head_tiles(out, model_shards, forms)
  if counts['amx']:
    logging.info('%d matrices take Intel AMX tile products (q8_amx) for 1 to %d rows',
                 counts['amx'], q8_amx.MAX_SPLIT_ROWS)
  logging.info('serving %d matrices from their int8 blocks: %.0f MB a step instead of %.0f MB '
               '(%.0f MB of other matrices as they are)', counts['split'],
               counts['q8 bytes'] / 1e6, counts['bytes split'] / 1e6, counts['bytes kept'] / 1e6)
  return out
