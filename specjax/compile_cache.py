"""JAX's persistent compilation cache, kept beside the weight cache.

A run compiles a prefill-and-decode program per method and shape bucket; on
the 270M model each takes 18-25 s on a CPU, and without a disk cache every new
process pays it again. `enable()` points JAX at `<cache dir>/jax-compile`
(`$SPECJAX_CACHE_DIR`, else ~/.cache/specjax, as for the weights), so a second
process reads those programs back instead of compiling them. The entry points
call it; a notebook calls it once, before its first run.

JAX treats the cache as trusted code (an entry is an executable), so a new
directory is made private to its user.
"""

from __future__ import annotations

import os
from pathlib import Path

from absl import logging
import jax
from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache

from specjax.checkpoints import weight_cache

SUBDIR = 'jax-compile'
# Programs that compile faster than this are not worth a disk entry: the small
# eager ops (a slice, a device_put) would each write one. Every decode program
# takes well over this on a CPU and about this on an accelerator.
DEFAULT_MIN_COMPILE_TIME_S = 0.5


def default_dir() -> Path:
  return weight_cache.default_cache_dir() / SUBDIR


def enable(cache_dir: str | os.PathLike | None = None,
           min_compile_time_s: float = DEFAULT_MIN_COMPILE_TIME_S) -> Path:
  """Turns the persistent cache on at `cache_dir` (default: `default_dir()`); returns it.

  Safe to call again, and after something has compiled already: JAX decides
  once per process whether it uses a cache, so that decision is reset here.
  """
  path = Path(cache_dir).expanduser() if cache_dir is not None else default_dir()
  try:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
  except OSError as e:  # a cache only: run without it rather than fail
    logging.warning('not using a compilation cache: cannot create %s: %s', path, e)
    return path
  jax.config.update('jax_compilation_cache_dir', str(path))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', float(min_compile_time_s))
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  jax_compilation_cache.reset_cache()
  logging.debug('compilation cache: %s (programs compiling in over %.2f s)', path,
               min_compile_time_s)
  return path
