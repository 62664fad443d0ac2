"""A GGUF header's fields, read without parsing the rest.

gguf.GGUFReader parses every field, the 262k-token vocabulary arrays of Gemma
3 included, into numpy views (13 s on a 2-core CPU); walking the header takes
a fraction of a second. `read_scalars` skips arrays, which is what checks made
before any weights load can afford (the chat template, the layer count);
`read_fields` also decodes the arrays of the keys it is asked for (the
tokenizer's vocabulary: 0.3 s), as GGUFReader's `field.contents()` gives them.
The weights themselves are still read by GGUFReader (`gguf_loader`).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
import struct
from typing import Any

import numpy as np

from specjax.checkpoints.errors import CheckpointError

_GGUF_MAGIC = b'GGUF'
# GGUF value type -> struct format of a scalar of that type; 8 is a string, 9 an array.
_SCALARS = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q',
            12: 'd'}
_STRING, _ARRAY = 8, 9


def read_scalars(path: str | os.PathLike) -> dict[str, Any] | None:
  """Every scalar and string field of the header, or None for a file that is not GGUF."""
  return _read(Path(path), (), not_gguf=None)


def read_fields(path: str | os.PathLike, prefixes: tuple[str, ...]) -> dict[str, Any]:
  """Every field whose key starts with one of `prefixes`, arrays included, decoded as
  GGUFReader's `field.contents()` decodes them (lists of Python values)."""
  return _read(Path(path), prefixes, not_gguf=CheckpointError(
      f'{path}: not a GGUF file (no GGUF magic)'))


def _read(path: Path, prefixes: tuple[str, ...], not_gguf: CheckpointError | None):
  """The header walked through a read-only map; `not_gguf` is returned or raised for a
  file without the magic."""
  with open(path, 'rb') as f:
    if f.read(len(_GGUF_MAGIC)) != _GGUF_MAGIC:
      if not_gguf is not None:
        raise not_gguf
      return None
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
      try:
        return _walk_header(data, prefixes)
      except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f'{path}: unreadable GGUF header: {e}') from e


def _walk_header(data, decode_arrays: tuple[str, ...] = ()) -> dict[str, Any]:
  """Scalars and strings of every key; arrays too of keys starting with `decode_arrays`
  (only those keys then)."""
  version, = struct.unpack_from('<I', data, 4)
  if version < 2:
    raise ValueError(f'GGUF version {version} is not supported (2 or later)')
  num_fields, = struct.unpack_from('<Q', data, 16)  # after the u64 tensor count
  offset, fields = 24, {}
  for _ in range(num_fields):
    key, offset = _string(data, offset)
    kind, = struct.unpack_from('<I', data, offset)
    offset += 4
    if decode_arrays:
      if key.startswith(decode_arrays):
        fields[key], offset = _value(data, offset, kind)
      else:
        offset = _skip(data, offset, kind)
      continue
    if kind == _STRING:
      fields[key], _ = _string(data, offset)
    elif kind in _SCALARS:
      fields[key], = struct.unpack_from('<' + _SCALARS[kind], data, offset)
    offset = _skip(data, offset, kind)
  return fields


def _value(data, offset: int, kind: int) -> tuple[Any, int]:
  """(the value of GGUF type `kind` at `offset`, the offset past it)."""
  if kind == _STRING:
    return _string(data, offset)
  if kind in _SCALARS:
    value, = struct.unpack_from('<' + _SCALARS[kind], data, offset)
    return value, offset + struct.calcsize(_SCALARS[kind])
  if kind != _ARRAY:
    raise ValueError(f'unknown GGUF value type {kind}')
  item_kind, count = struct.unpack_from('<IQ', data, offset)
  offset += 12
  if item_kind in _SCALARS:   # one read for the whole array
    item = np.dtype('<' + _SCALARS[item_kind])
    end = offset + count * item.itemsize
    if end > len(data):
      raise ValueError('an array runs past the end of the file')
    return np.frombuffer(data, item, count, offset).tolist(), end
  items = []
  for _ in range(count):   # strings (a vocabulary) or nested arrays
    value, offset = _value(data, offset, item_kind)
    if item_kind == _ARRAY:
      items.extend(value)   # flattened, as GGUFReader's contents() gives nested arrays
    else:
      items.append(value)
  return items, offset


def _string(data, offset: int) -> tuple[str, int]:
  size, = struct.unpack_from('<Q', data, offset)
  start = offset + 8
  if start + size > len(data):
    raise ValueError('a string runs past the end of the file')
  return bytes(data[start:start + size]).decode('utf-8'), start + size


def _skip(data, offset: int, kind: int) -> int:
  """The offset just past a value of GGUF type `kind` starting at `offset`."""
  if kind in _SCALARS:
    return offset + struct.calcsize(_SCALARS[kind])
  if kind == _STRING:
    size, = struct.unpack_from('<Q', data, offset)
    return offset + 8 + size
  if kind == _ARRAY:
    item_kind, count = struct.unpack_from('<IQ', data, offset)
    offset += 12
    if item_kind in _SCALARS:
      return offset + count * struct.calcsize(_SCALARS[item_kind])
    for _ in range(count):  # strings (a vocabulary) or nested arrays
      offset = _skip(data, offset, item_kind)
    return offset
  raise ValueError(f'unknown GGUF value type {kind}')
