"""Loading Gemma weights: GGUF, Hugging Face safetensors, Orbax, and the embedded model.

`load_checkpoint` picks the loader from what its argument is; every loader
returns (GemmaConfig, params) with float32 host arrays in the layout of
`specjax.models.gemma`, and raises CheckpointError naming the file at fault.
`content_digest` names a checkpoint by its bytes rather than its path.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from specjax.checkpoints.errors import CheckpointError
from specjax.models.config import GemmaConfig

__all__ = ['CheckpointError', 'content_digest', 'load_checkpoint']

_GGUF_MAGIC = b'GGUF'


def _is_gguf(path: Path) -> bool:
  if path.suffix.lower() == '.gguf':
    return True
  with path.open('rb') as f:
    return f.read(len(_GGUF_MAGIC)) == _GGUF_MAGIC


def load_checkpoint(path_or_name: str | os.PathLike, cache_dir: str | os.PathLike | None = None
                    ) -> tuple[GemmaConfig, dict[str, Any]]:
  """(config, params) from a .gguf file, a Hugging Face directory, an Orbax directory,
  or 'embedded:gemma3-270m'. GGUF conversions are kept in the weight cache at `cache_dir`.
  """
  # Loaders import lazily: Orbax and safetensors cost ~1 s to import.
  from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
  if str(path_or_name).startswith('embedded:'):
    if str(path_or_name) != embedded.EMBEDDED_NAME:
      raise CheckpointError(f'{path_or_name}: unknown embedded model; '
                            f'the one embedded model is {embedded.EMBEDDED_NAME!r}')
    return embedded.load_default_target(cache_dir)
  path = Path(path_or_name).expanduser()
  if path.is_file() and (path.suffix == '.safetensors' or path.name == 'config.json'
                         or path.name.endswith('.safetensors.index.json')):
    path = path.parent  # a file of a Hugging Face directory stands for the directory
  if path.is_file() and _is_gguf(path):
    from specjax.checkpoints import weight_cache  # pylint: disable=g-import-not-at-top
    return weight_cache.load_gguf_cached(path, cache_dir)
  if path.is_dir() and (path / 'config.json').is_file():
    from specjax.checkpoints import safetensors_loader  # pylint: disable=g-import-not-at-top
    return safetensors_loader.load_safetensors(path)
  if path.is_dir():
    from specjax.checkpoints import orbax_io  # pylint: disable=g-import-not-at-top
    if orbax_io.is_orbax_checkpoint(path):
      return orbax_io.load_orbax(path)
    raise CheckpointError(f'{path}: neither a Hugging Face directory (config.json) '
                          'nor an Orbax checkpoint')
  if path.is_file():
    raise CheckpointError(f'{path}: not a GGUF file; pass a .gguf file, a Hugging Face '
                          'directory or an Orbax checkpoint directory')
  raise CheckpointError(f'{path}: no such file or directory')


def content_digest(path_or_name: str | os.PathLike, cache_dir: str | os.PathLike | None = None
                   ) -> str:
  """A sha256 that changes whenever the checkpoint's bytes do (what resumed rows are keyed by).

  The embedded model's is its package's, which `assemble` checks the file
  against on every load; a file's is `weight_cache.file_sha256` (memoised, so
  only a changed file is read again); a directory's covers every file's
  relative path and sha256.
  """
  from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
  from specjax.checkpoints import weight_cache  # pylint: disable=g-import-not-at-top
  if str(path_or_name) == embedded.EMBEDDED_NAME:
    return embedded.content_sha256()
  path = Path(path_or_name).expanduser()
  if path.is_file():
    return weight_cache.file_sha256(path, cache_dir)
  if not path.is_dir():
    raise CheckpointError(f'{path}: no such file or directory')
  digest = hashlib.sha256()
  for file in sorted(p for p in path.rglob('*') if p.is_file()):
    digest.update(f'{file.relative_to(path)}\0{weight_cache.file_sha256(file, cache_dir)}\n'
                  .encode())
  return digest.hexdigest()
