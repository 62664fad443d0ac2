"""The teacher pass's arrays kept on disk, so that a resumed training run does not redo them.

The target's features for a million training tokens at three layers are 8 GB and cost
a 2-core CPU about a quarter of an hour, more than a hundred training steps. Held only in
memory, they were recomputed at every resume of a killed run. Here each array is a
`.npy` file opened as a memory map (`np.lib.format.open_memmap`), filled in the order
the pass computes it, and `progress.json` beside the files records two things:

- the key: everything the arrays are a function of (the target's digest, the layers,
  the tokens' digest, the draft head's digest, the batch the pass ran at, the jax
  version and backend, the arrays' shapes);
- how many sequences are done, written only after their rows were flushed.

So a finished pass is read back instead of recomputed, a pass killed midway goes on
from its last flushed batch with the same compiled program (the rows are the same
bits as an unbroken pass's), and a store whose key differs (another target, other
layers, other data) is cleared and filled again, never read. Reading rows from the
map instead of an in-memory copy also leaves the features in the page cache, not in
the process's own memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any

from absl import logging
import jax
import numpy as np

PROGRESS = 'progress.json'


def digest(*arrays) -> str:
  """sha256 over arrays' shapes, dtypes and bytes (None counts as absent)."""
  h = hashlib.sha256()
  for a in arrays:
    if a is None:
      h.update(b'none')
      continue
    a = np.ascontiguousarray(np.asarray(a))
    h.update(f'{a.shape}{a.dtype.str}'.encode())
    h.update(a.tobytes())
  return h.hexdigest()


def environment() -> dict[str, str]:
  """What else decides the pass's bits: the jax version and the device it ran on."""
  return {'jax': jax.__version__, 'backend': jax.default_backend(),
          'device': jax.devices()[0].device_kind}


class Store:
  """Arrays named by `shapes` ({name: (shape, dtype)}) in `directory`, for `key`.

  `arrays` are memory maps; `done` is how many leading rows (sequences) hold results."""

  def __init__(self, directory: str, key: dict[str, Any],
               shapes: dict[str, tuple[tuple[int, ...], Any]]):
    self.directory = directory
    self.key = {**key, 'shapes': {name: [list(shape), np.dtype(dtype).str]
                                  for name, (shape, dtype) in shapes.items()}}
    self.arrays: dict[str, np.ndarray] = {}
    self.done = self._reopen(shapes)
    if self.done is None:
      self._create(shapes)
      self.done = 0

  def _path(self, name: str) -> str:
    return os.path.join(self.directory, f'{name}.npy')

  def _reopen(self, shapes) -> int | None:
    """Rows done in a store made for this key; None when there is none to go on from."""
    try:
      with open(os.path.join(self.directory, PROGRESS), encoding='utf-8') as f:
        progress = json.load(f)
    except FileNotFoundError:
      return None
    except (OSError, ValueError) as e:
      logging.warning('teacher store %s: unreadable %s (%s); computing it again',
                      self.directory, PROGRESS, e)
      return None
    if progress.get('key') != self.key:
      logging.info('teacher store %s was made for other inputs; computing it again',
                   self.directory)
      return None
    try:
      for name, (shape, dtype) in shapes.items():
        # Read-only first: mapped 'r+', numpy would extend a truncated file with zeros.
        array = np.load(self._path(name), mmap_mode='r')
        if array.shape != tuple(shape) or array.dtype != np.dtype(dtype):
          raise ValueError(f'{name}.npy is {array.shape} {array.dtype}')
        self.arrays[name] = np.load(self._path(name), mmap_mode='r+')
    except (OSError, ValueError) as e:   # a missing or truncated array file
      logging.warning('teacher store %s: %s; computing it again', self.directory, e)
      self.arrays = {}
      return None
    return int(progress['done'])

  def _create(self, shapes) -> None:
    if os.path.isdir(self.directory):
      shutil.rmtree(self.directory)
    os.makedirs(self.directory)
    for name, (shape, dtype) in shapes.items():
      self.arrays[name] = np.lib.format.open_memmap(self._path(name), mode='w+', dtype=dtype,
                                                    shape=tuple(shape))
    self.commit(0)

  def commit(self, done: int) -> None:
    """Records that the first `done` rows are final: flushed first, then the record,
    written atomically, so a kill between the two only loses work, never trusts it."""
    for array in self.arrays.values():
      array.flush()
    tmp = os.path.join(self.directory, PROGRESS + '.tmp')
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump({'key': self.key, 'done': done}, f, indent=1)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, os.path.join(self.directory, PROGRESS))
    self.done = done
