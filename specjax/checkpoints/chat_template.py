"""The chat template a checkpoint carries, if any: the mark of an instruction-tuned model.

Instruction-tuned checkpoints ship the template their turns were trained with
(GGUF metadata `tokenizer.chat_template`; in a Hugging Face directory
`chat_template` in tokenizer_config.json, or a chat_template.jinja/.json file);
base checkpoints usually do not. The experiment wraps prompts in chat turns
only when one is there, since a base model given chat markup tends to echo it.

A GGUF is read by walking its header here rather than through gguf.GGUFReader,
which parses every field (~10 s for Gemma 3's 262k-token vocabulary); skipping
the fields we do not want takes a fraction of a second.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
import struct

from specjax.checkpoints.errors import CheckpointError

GGUF_KEY = 'tokenizer.chat_template'
_GGUF_MAGIC = b'GGUF'
# GGUF value type -> struct format of a scalar of that type; 8 is a string, 9 an array.
_SCALARS = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q',
            12: 'd'}
_STRING, _ARRAY = 8, 9


def find(path: str | os.PathLike) -> str | None:
  """The chat template of a GGUF file or a Hugging Face directory; None when it has none."""
  path = Path(path).expanduser()
  if path.is_dir():
    return hf_chat_template(path)
  if path.is_file():
    if path.suffix == '.safetensors' or path.name == 'config.json':
      return hf_chat_template(path.parent)
    return gguf_chat_template(path)
  raise CheckpointError(f'{path}: no such file or directory')


def hf_chat_template(directory: Path) -> str | None:
  jinja = directory / 'chat_template.jinja'
  if jinja.is_file():
    return jinja.read_text(encoding='utf-8') or None
  for name in ('tokenizer_config.json', 'chat_template.json'):
    try:
      template = json.loads((directory / name).read_text(encoding='utf-8')).get('chat_template')
    except FileNotFoundError:
      continue
    except (OSError, ValueError, AttributeError) as e:
      raise CheckpointError(f'{directory / name}: unreadable: {e}') from e
    if template:  # a string, or a list of named templates
      return template if isinstance(template, str) else json.dumps(template)
  return None


def gguf_chat_template(path: Path) -> str | None:
  """`tokenizer.chat_template` from a GGUF's header, or None (also for a non-GGUF file)."""
  with open(path, 'rb') as f:
    if f.read(len(_GGUF_MAGIC)) != _GGUF_MAGIC:
      return None
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
      try:
        return _walk_header(data)
      except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f'{path}: unreadable GGUF header: {e}') from e


def _walk_header(data) -> str | None:
  version, = struct.unpack_from('<I', data, 4)
  if version < 2:
    raise ValueError(f'GGUF version {version} is not supported (2 or later)')
  num_fields, = struct.unpack_from('<Q', data, 16)  # after the u64 tensor count
  offset = 24
  for _ in range(num_fields):
    key, offset = _string(data, offset)
    kind, = struct.unpack_from('<I', data, offset)
    offset += 4
    if key == GGUF_KEY and kind == _STRING:
      return _string(data, offset)[0] or None
    offset = _skip(data, offset, kind)
  return None


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
