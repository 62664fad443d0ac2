"""A disk cache of converted GGUF weights: one float32 .npy per leaf, memory-mapped.

Opening the embedded Gemma 3 270M GGUF takes ~10 s and dequantizing it ~4 s;
reading the cache back with `np.load(mmap_mode='r')` takes well under a
second, and pages are only read when used.

An entry is named by the source file's sha256 and `FORMAT_VERSION` (bump it
when the conversion changes), so an edited or replaced file never hits a stale
entry. It is built in a temporary directory, finished by a `COMPLETE` marker
written last, and renamed into place: an interrupted build is never mistaken
for a finished one, and an entry without its marker is rebuilt.

Layout of `<cache_dir>/params-v<FORMAT_VERSION>-<sha256>/`:
  config.json     the GemmaConfig
  metadata.json   the GGUF's general.* and tokenizer.ggml.* fields
  params/*.npy    one file per leaf, named by its dotted path
  COMPLETE        written last: format version, source hash, leaf names
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
import shutil
import tempfile
from typing import Any
import uuid

from absl import logging
import numpy as np

from specjax.checkpoints import gguf_loader
from specjax.checkpoints import param_tree
from specjax.checkpoints.config_io import config_from_dict, config_to_dict
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import GemmaConfig

FORMAT_VERSION = 2  # 2: matrices stored (out, in)
CACHE_DIR_ENV = 'SPECJAX_CACHE_DIR'
COMPLETE_MARKER = 'COMPLETE'

_HASH_CHUNK_BYTES = 1 << 22


def default_cache_dir() -> Path:
  """$SPECJAX_CACHE_DIR, else ~/.cache/specjax."""
  return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / '.cache' / 'specjax').expanduser()


def _resolve(cache_dir: str | os.PathLike | None) -> Path:
  return default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()


def _write_json_atomically(path: Path, value: Any) -> None:
  tmp = path.with_name(f'.{path.name}.{uuid.uuid4().hex}.tmp')
  tmp.write_text(json.dumps(value))
  os.replace(tmp, path)


def file_sha256(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
  """The file's sha256, memoised under the cache dir by (path, size, mtime)."""
  path = Path(path).resolve()
  try:
    stat = path.stat()
  except OSError as e:
    raise CheckpointError(f'{path}: cannot read: {e}') from e
  memo = _resolve(cache_dir) / 'sha256' / (hashlib.sha1(str(path).encode()).hexdigest() + '.json')
  key = {'path': str(path), 'size': stat.st_size, 'mtime_ns': stat.st_mtime_ns}
  try:
    saved = json.loads(memo.read_text())
    if {k: saved.get(k) for k in key} == key:
      return saved['sha256']
  except (OSError, ValueError, KeyError):
    pass
  digest = hashlib.sha256()
  with path.open('rb') as f:
    while block := f.read(_HASH_CHUNK_BYTES):
      digest.update(block)
  memo.parent.mkdir(parents=True, exist_ok=True)
  _write_json_atomically(memo, {**key, 'sha256': digest.hexdigest()})
  return digest.hexdigest()


def entry_dir(sha256: str, cache_dir: str | os.PathLike | None = None) -> Path:
  return _resolve(cache_dir) / f'params-v{FORMAT_VERSION}-{sha256}'


def _read_entry(entry: Path) -> tuple[GemmaConfig, dict[str, Any]] | None:
  """The entry's (config, memory-mapped params), or None unless it is complete and readable."""
  try:
    marker = json.loads((entry / COMPLETE_MARKER).read_text())
    if marker.get('format_version') != FORMAT_VERSION:
      return None
    config = config_from_dict(json.loads((entry / 'config.json').read_text()), entry)
    flat = {leaf: np.load(entry / 'params' / f'{leaf}.npy', mmap_mode='r')
            for leaf in marker['leaves']}
  except FileNotFoundError:
    return None
  except (OSError, ValueError, KeyError, CheckpointError) as e:
    logging.warning('weight cache entry %s is unreadable (%s); rebuilding it', entry, e)
    return None
  return config, param_tree.unflatten(flat)


def _write_entry(entry: Path, sha256: str, source: Path, config: GemmaConfig,
                 params: dict[str, Any], metadata: dict[str, Any]) -> None:
  entry.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f'.{entry.name}.', dir=entry.parent))
  try:
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    (tmp / 'config.json').write_text(json.dumps(config_to_dict(config), indent=1))
    (tmp / 'metadata.json').write_text(json.dumps(metadata))
    (tmp / 'params').mkdir()
    flat = param_tree.flatten(params)
    for leaf, value in flat.items():
      np.save(tmp / 'params' / f'{leaf}.npy', np.asarray(value, np.float32))
    (tmp / COMPLETE_MARKER).write_text(json.dumps({
        'format_version': FORMAT_VERSION, 'source_sha256': sha256, 'source_path': str(source),
        'leaves': sorted(flat)}))
    if entry.exists():  # an incomplete or outdated leftover
      shutil.rmtree(entry, ignore_errors=True)
    try:
      os.rename(tmp, entry)
    except OSError:
      if not (entry / COMPLETE_MARKER).exists():  # not a concurrent writer's finished entry
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _load(path: str | os.PathLike, cache_dir: str | os.PathLike | None
          ) -> tuple[Path, GemmaConfig, dict[str, Any]]:
  """(entry dir, config, params) of a GGUF, converting the file into the cache if need be."""
  path = Path(path)
  if not path.is_file():
    raise CheckpointError(f'{path}: no such GGUF file')
  sha256 = file_sha256(path, cache_dir)
  entry = entry_dir(sha256, cache_dir)
  loaded = _read_entry(entry)
  if loaded is None:
    logging.info('converting %s into the weight cache at %s', path, entry)
    reader = gguf_loader.open_gguf(path)
    config = gguf_loader.gguf_config(reader, path)
    params = gguf_loader.gguf_params(reader, config, path)
    metadata = gguf_loader.gguf_metadata(reader, path)
    try:
      _write_entry(entry, sha256, path, config, params, metadata)
    except OSError as e:
      raise CheckpointError(f'{path}: cannot write weight cache entry {entry}: {e}') from e
    loaded = _read_entry(entry)
    if loaded is None:
      raise CheckpointError(f'{path}: weight cache entry {entry} is unreadable right after writing')
  return (entry, *loaded)


def load_gguf_cached(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None
                     ) -> tuple[GemmaConfig, dict[str, Any]]:
  """(config, float32 params) of a GGUF; the params are read-only memory-mapped arrays.

  `jax.device_put` them once (with the shardings you want) before decoding.
  """
  _, config, params = _load(path, cache_dir)
  return config, params


def read_gguf_metadata_cached(path: str | os.PathLike,
                              cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
  """`gguf_loader.read_gguf_metadata`, from the cache entry (building it if absent)."""
  entry, _, _ = _load(path, cache_dir)
  try:
    return json.loads((entry / 'metadata.json').read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{path}: unreadable metadata in weight cache entry {entry}: {e}') from e
