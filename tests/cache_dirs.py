"""A fresh specjax cache directory for a test's subprocess, its CPU kernels shared.

Tests that run an entry point in a subprocess give it its own $SPECJAX_CACHE_DIR,
so that what they check (weights, compiled programs, resumed rows) starts from
nothing. The hand-written CPU kernels are not among those things, and building
the four a tiny run loads takes about 25 s of a 2-core machine's compiler each
time. They are built atomically and keyed by their source, flags and CPU
(`cpu_kernels/build.library_path`), so every such directory can share the
user's built kernels.
"""

import pathlib

from specjax.checkpoints import weight_cache
from specjax.cpu_kernels import build


def fresh_cache_dir(path: pathlib.Path) -> pathlib.Path:
  """Makes `path` an empty cache directory whose `cpu-kernels` are the user's; returns it."""
  path.mkdir(parents=True, exist_ok=True)
  shared = weight_cache.default_cache_dir() / build.SUBDIR
  shared.mkdir(parents=True, exist_ok=True, mode=0o700)
  (path / build.SUBDIR).symlink_to(shared, target_is_directory=True)
  return path
