"""A disk cache of converted GGUF weights: one float32 .npy per leaf, memory-mapped.

Opening the embedded Gemma 3 270M GGUF takes ~10 s and dequantizing it ~4 s;
reading the cache back with `np.load(mmap_mode='r')` takes well under a
second, and pages are only read when used.

An entry is named by the source file's sha256 and `FORMAT_VERSION` (bump it
when the conversion changes), so an edited or replaced file never hits a stale
entry. It is built in a temporary directory, finished by a `COMPLETE` marker
written last, and renamed into place: an interrupted build is never mistaken
for a finished one, and an entry without its marker is rebuilt.

The marker also records the sha256 of every file in the entry, and every load
checks them all: a cache damaged in place (same size, valid headers) would
otherwise decode silently wrong (an overwritten 2 MB inside one leaf made the
270M model emit only `<pad>`). A mismatch is logged and the entry rebuilt.
Hashing runs in memory-mapped 64 MiB chunks on every core. It is the price of
a warm load: 0.1 s unverified (pages map lazily), 0.75-1.3 s verified for the
270M entry (1.1 GB) on this project's 2 shared CPU cores, at load average 3-5.

Processes that find an entry missing at the same time (the test suite's two
workers on a fresh machine, two runs started together) build it one at a
time, under an exclusive lock on `.<entry name>.lock` beside it: the second
reads what the first wrote instead of converting again. Without the lock the
second writer took the first one's finished entry for a leftover and deleted
it, as the first was reading it back ("unreadable right after writing").

Layout of `<cache_dir>/params-v<FORMAT_VERSION>-<sha256>/`:
  config.json     the GemmaConfig
  metadata.json   the GGUF's general.* and tokenizer.ggml.* fields
  params/*.npy    one file per leaf, named by its dotted path
  COMPLETE        written last: format version, source hash, leaf names, file digests

Arrays computed from a checkpoint (the int8 forms of its matrices, which take
2.1 s to split for the 270M) are kept the same way in
`<cache_dir>/<kind>-v<version>-<sha256>/arrays/*.npy` (`derived_arrays`).
"""

from __future__ import annotations

from concurrent import futures
import contextlib
import fcntl
import hashlib
import json
import mmap
import os
from pathlib import Path
import shutil
import tempfile
from typing import Any, Callable
import uuid

from absl import logging
import numpy as np

from specjax.checkpoints import gguf_loader
from specjax.checkpoints import param_tree
from specjax.checkpoints.config_io import config_from_dict, config_to_dict
from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import GemmaConfig

FORMAT_VERSION = 4  # 4: matrices stored (out, in), and every file's sha256 in the marker
CACHE_DIR_ENV = 'SPECJAX_CACHE_DIR'
COMPLETE_MARKER = 'COMPLETE'

_HASH_CHUNK_BYTES = 1 << 22
_DIGEST_CHUNK_BYTES = 64 << 20  # a unit of parallel hashing in `entry_digests`


def default_cache_dir() -> Path:
  """$SPECJAX_CACHE_DIR, else ~/.cache/specjax."""
  return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / '.cache' / 'specjax').expanduser()


def resolve_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
  return default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()


def _write_json_atomically(path: Path, value: Any) -> None:
  tmp = path.with_name(f'.{path.name}.{uuid.uuid4().hex}.tmp')
  tmp.write_text(json.dumps(value))
  os.replace(tmp, path)


def file_sha256(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> str:
  """The file's sha256, memoised under the cache dir by (path, inode, size, mtime, ctime).

  ctime is in the key because a program can restore mtime (os.utime) after
  rewriting a file in place, but any write or utime moves ctime to now.
  """
  path = Path(path).resolve()
  try:
    stat = path.stat()
  except OSError as e:
    raise CheckpointError(f'{path}: cannot read: {e}') from e
  memo_name = hashlib.sha1(str(path).encode()).hexdigest() + '.json'
  memo = resolve_cache_dir(cache_dir) / 'sha256' / memo_name
  key = {'path': str(path), 'inode': stat.st_ino, 'size': stat.st_size,
         'mtime_ns': stat.st_mtime_ns, 'ctime_ns': stat.st_ctime_ns}
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
  return resolve_cache_dir(cache_dir) / f'params-v{FORMAT_VERSION}-{sha256}'


def entry_digests(entry: Path, names: list[str]) -> dict[str, str]:
  """sha256 of each file of `entry` (relative names), hashed in parallel chunks.

  A file's digest is the sha256 of its 64 MiB chunks' sha256 digests, so the
  671 MB embedding leaf of the 270M model spreads over every core (hashlib
  releases the GIL); chunks are memory-mapped, not copied. Measured on this
  project's 2 shared CPU cores, page cache warm, load average 3: 0.75 s for the
  1.1 GB entry (1.1 s for one sha256 per file, 1.9 s reading each file into
  memory first); 1.2-1.3 s at load average 5.
  """
  sizes = {name: (entry / name).stat().st_size for name in names}
  chunks = [(name, offset) for name in names
            for offset in range(0, max(sizes[name], 1), _DIGEST_CHUNK_BYTES)]

  def hash_chunk(chunk):
    name, offset = chunk
    length = min(_DIGEST_CHUNK_BYTES, sizes[name] - offset)
    if length <= 0:  # an empty file cannot be mapped
      return hashlib.sha256(b'').digest()
    with (entry / name).open('rb') as f, mmap.mmap(f.fileno(), length, offset=offset,
                                                     access=mmap.ACCESS_READ) as view:
      return hashlib.sha256(view).digest()

  with futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    chunk_digests = list(pool.map(hash_chunk, chunks))
  per_file = {name: hashlib.sha256() for name in names}
  for (name, _), digest in zip(chunks, chunk_digests):
    per_file[name].update(digest)
  return {name: h.hexdigest() for name, h in per_file.items()}


@contextlib.contextmanager
def _one_builder(entry: Path):
  """Holds an exclusive lock on `.<entry name>.lock` beside `entry`, waiting for it.

  Where the lock file cannot be made (a read-only cache), it does not lock: the build
  that follows fails or goes uncached there anyway, with its own message.
  """
  try:
    entry.parent.mkdir(parents=True, exist_ok=True)
    lock = open(entry.parent / f'.{entry.name}.lock', 'a')  # pylint: disable=consider-using-with
  except OSError:
    yield
    return
  with lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _entry_files(leaves) -> list[str]:
  return ['config.json', 'metadata.json'] + [f'params/{leaf}.npy' for leaf in leaves]


def _verify(entry: Path, marker: dict[str, Any], names: list[str]) -> str | None:
  """The first of the entry's files (`names`) whose content differs from the digest the
  marker recorded at write time, else None."""
  recorded = marker['sha256']
  if sorted(recorded) != sorted(names):
    return COMPLETE_MARKER
  actual = entry_digests(entry, names)
  return next((name for name in names if actual[name] != recorded[name]), None)


def _read_entry(entry: Path) -> tuple[GemmaConfig, dict[str, Any]] | None:
  """The entry's (config, memory-mapped params), or None unless it is complete, readable,
  and every file's content matches its recorded digest."""
  try:
    marker = json.loads((entry / COMPLETE_MARKER).read_text())
    if marker.get('format_version') != FORMAT_VERSION:
      return None
    damaged = _verify(entry, marker, _entry_files(marker['leaves']))
    if damaged is not None:
      logging.warning('weight cache entry %s: %s does not match the digest recorded when it '
                      'was written (damaged on disk); rebuilding the entry', entry, damaged)
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


def _publish(entry: Path, fill, marker: dict[str, Any], names) -> None:
  """Builds an entry in a temporary directory (`fill(tmp)` writes its files, `names(tmp)`
  lists them), writes its marker with every file's digest last, and renames it into place."""
  entry.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f'.{entry.name}.', dir=entry.parent))
  try:
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    fill(tmp)
    (tmp / COMPLETE_MARKER).write_text(json.dumps({
        **marker, 'sha256': entry_digests(tmp, names(tmp))}))
    if entry.exists():  # an incomplete or outdated leftover
      shutil.rmtree(entry, ignore_errors=True)
    try:
      os.rename(tmp, entry)
    except OSError:
      if not (entry / COMPLETE_MARKER).exists():  # not a concurrent writer's finished entry
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _write_entry(entry: Path, sha256: str, source: Path, config: GemmaConfig,
                 params: dict[str, Any], metadata: dict[str, Any]) -> None:
  flat = param_tree.flatten(params)

  def fill(tmp: Path) -> None:
    (tmp / 'config.json').write_text(json.dumps(config_to_dict(config), indent=1))
    (tmp / 'metadata.json').write_text(json.dumps(metadata))
    (tmp / 'params').mkdir()
    for leaf, value in flat.items():
      np.save(tmp / 'params' / f'{leaf}.npy', np.asarray(value, np.float32))

  _publish(entry, fill, {'format_version': FORMAT_VERSION, 'source_sha256': sha256,
                         'source_path': str(source), 'leaves': sorted(flat)},
           lambda _: _entry_files(sorted(flat)))


def _load(path: str | os.PathLike, cache_dir: str | os.PathLike | None
          ) -> tuple[Path, GemmaConfig, dict[str, Any]]:
  """(entry dir, config, params) of a GGUF, converting the file into the cache if need be."""
  path = Path(path)
  if not path.is_file():
    raise CheckpointError(f'{path}: no such GGUF file')
  sha256 = file_sha256(path, cache_dir)
  entry = entry_dir(sha256, cache_dir)
  loaded = _read_entry(entry)
  if loaded is not None:
    return (entry, *loaded)
  with _one_builder(entry):
    loaded = _read_entry(entry)   # built by another process while this one waited
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
        raise CheckpointError(
            f'{path}: weight cache entry {entry} is unreadable right after writing')
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


def derived_dir(kind: str, version: int, sha256: str,
                cache_dir: str | os.PathLike | None = None) -> Path:
  return resolve_cache_dir(cache_dir) / f'{kind}-v{version}-{sha256}'


def _read_derived(entry: Path, version: int) -> dict[str, np.ndarray] | None:
  try:
    marker = json.loads((entry / COMPLETE_MARKER).read_text())
    if marker.get('format_version') != version:
      return None
    damaged = _verify(entry, marker, [f'arrays/{name}.npy' for name in marker['names']])
    if damaged is not None:
      logging.warning('cache entry %s: %s does not match the digest recorded when it was '
                      'written (damaged on disk); rebuilding the entry', entry, damaged)
      return None
    return {name: np.load(entry / 'arrays' / f'{name}.npy', mmap_mode='r')
            for name in marker['names']}
  except FileNotFoundError:
    return None
  except (OSError, ValueError, KeyError) as e:
    logging.warning('cache entry %s is unreadable (%s); rebuilding it', entry, e)
    return None


def derived_arrays(kind: str, version: int, sha256: str,
                   make: Callable[[], dict[str, np.ndarray]],
                   cache_dir: str | os.PathLike | None = None) -> dict[str, np.ndarray]:
  """Arrays computed from a checkpoint, kept in the cache beside its weights.

  `make()` returns them (name -> numpy array; names are file names, e.g. dotted
  leaf names) the first time; after that they are read back memory-mapped from
  `<cache_dir>/<kind>-v<version>-<sha256>/`, checked against the digests
  recorded when they were written, like a weight entry (a damaged entry is
  rebuilt). `sha256` names what they were computed from (the checkpoint's
  content digest), `version` how: bump it when `make` changes. The int8 forms
  of the 270M's matrices (`models/q8_weights.all_forms`) take 2.1 s to split
  and 0.3 s to verify from here.
  """
  entry = derived_dir(kind, version, sha256, cache_dir)
  found = _read_derived(entry, version)
  if found is not None:
    return found
  with _one_builder(entry):
    return _build_derived(entry, kind, version, sha256, make)


def _build_derived(entry: Path, kind: str, version: int, sha256: str,
                   make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  found = _read_derived(entry, version)   # built by another process while this one waited
  if found is not None:
    return found
  arrays = make()
  bad = [name for name in arrays if not name or '/' in name or name.startswith('.')]
  if bad:
    raise ValueError(f'derived array names must be plain file names, got {bad}')

  def fill(tmp: Path) -> None:
    (tmp / 'arrays').mkdir()
    for name, value in arrays.items():
      np.save(tmp / 'arrays' / f'{name}.npy', np.asarray(value))

  names = sorted(arrays)
  try:
    _publish(entry, fill, {'format_version': version, 'kind': kind, 'source_sha256': sha256,
                           'names': names},
             lambda _: [f'arrays/{name}.npy' for name in names])
  except OSError as e:
    logging.warning('cannot write cache entry %s (%s); using the arrays without caching them',
                    entry, e)
    return arrays
  found = _read_derived(entry, version)
  return arrays if found is None else found
