"""A GGUF header's scalar and string fields, read without parsing the rest.

gguf.GGUFReader parses every field, the 262k-token vocabulary arrays of Gemma
3 included (~10 s); walking the header and skipping arrays takes a fraction
of a second, which is what checks made before any weights load can afford
(the chat template, the layer count).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
import struct
from typing import Any

from specjax.checkpoints.errors import CheckpointError

_GGUF_MAGIC = b'GGUF'
# GGUF value type -> struct format of a scalar of that type; 8 is a string, 9 an array.
_SCALARS = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q',
            12: 'd'}
_STRING, _ARRAY = 8, 9


def read_scalars(path: str | os.PathLike) -> dict[str, Any] | None:
  """Every scalar and string field of the header, or None for a file that is not GGUF."""
  path = Path(path)
  with open(path, 'rb') as f:
    if f.read(len(_GGUF_MAGIC)) != _GGUF_MAGIC:
      return None
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
      try:
        return _walk_header(data)
      except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f'{path}: unreadable GGUF header: {e}') from e


def _walk_header(data) -> dict[str, Any]:
  version, = struct.unpack_from('<I', data, 4)
  if version < 2:
    raise ValueError(f'GGUF version {version} is not supported (2 or later)')
  num_fields, = struct.unpack_from('<Q', data, 16)  # after the u64 tensor count
  offset, fields = 24, {}
  for _ in range(num_fields):
    key, offset = _string(data, offset)
    kind, = struct.unpack_from('<I', data, offset)
    offset += 4
    if kind == _STRING:
      fields[key], _ = _string(data, offset)
    elif kind in _SCALARS:
      fields[key], = struct.unpack_from('<' + _SCALARS[kind], data, offset)
    offset = _skip(data, offset, kind)
  return fields


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
