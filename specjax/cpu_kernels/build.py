"""Compiles this package's C++ kernels on first use and registers them with XLA:CPU.

A kernel is one .cc file beside this one (with the shared headers here), built against the XLA FFI headers
that ship with jaxlib (`jax.ffi.include_dir()`) by the system's C++ compiler
(`$CXX`, else c++, g++ or clang++) with -O3 -march=native -ffp-contract=off, and registered as a
CPU FFI target. `$SPECJAX_CPU_KERNELS_MARCH` replaces `native` (`haswell`
builds what an AVX2-only CPU gets, to measure it on a newer one). Building takes a few seconds, so the library is kept in
`<cache dir>/cpu-kernels/` ($SPECJAX_CACHE_DIR, else ~/.cache/specjax), named
by a hash of everything that decides its bits: the source and headers, the flags, the
compiler's version, jaxlib's version and this CPU's model and feature flags (a
cache shared between machines never hands one an instruction it lacks). It is
written to a temporary name and renamed into place, so processes building it
side by side (pytest workers) never load half a file.

Where no compiler is found, or the build fails, `load` says why once in the log
and returns False; callers then keep XLA's own kernels, which give the same
numbers more slowly. `$SPECJAX_CPU_KERNELS=0` turns the kernels off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from pathlib import Path
import platform
import shutil
import subprocess
import uuid

from absl import logging
import jax
import jax.numpy as jnp
import jaxlib

DISABLE_ENV = 'SPECJAX_CPU_KERNELS'
CXX_ENV = 'CXX'
MARCH_ENV = 'SPECJAX_CPU_KERNELS_MARCH'
SUBDIR = 'cpu-kernels'
_FLAGS = ('-O3', '-std=gnu++17', '-ffp-contract=off', '-shared', '-fPIC')
_SOURCE_DIR = Path(__file__).resolve().parent


class KernelBuildError(RuntimeError):
  """A kernel could not be compiled or loaded; the message says why."""


def flags() -> tuple[str, ...]:
  """The compiler flags: -march=native unless $SPECJAX_CPU_KERNELS_MARCH names another target."""
  march = os.environ.get(MARCH_ENV, '').strip() or 'native'
  return (f'-march={march}',) + _FLAGS


def enabled() -> bool:
  return os.environ.get(DISABLE_ENV, '1').strip().lower() not in ('0', 'false', 'no', 'off')


def find_compiler() -> str | None:
  """$CXX if set (it must exist), else the first of c++, g++, clang++ on PATH."""
  if os.environ.get(CXX_ENV):
    return shutil.which(os.environ[CXX_ENV])
  for name in ('c++', 'g++', 'clang++'):
    if path := shutil.which(name):
      return path
  return None


def _cpu_fingerprint() -> str:
  """The CPU's model name and feature flags, where the OS says them."""
  try:
    lines = Path('/proc/cpuinfo').read_text().splitlines()
  except OSError:
    return platform.processor() or platform.machine()
  keep = [l for l in lines if l.split(':')[0].strip() in ('model name', 'flags', 'Features')]
  return '\n'.join(sorted(set(keep)))


def _compiler_version(cxx: str) -> str:
  out = subprocess.run([cxx, '--version'], capture_output=True, text=True, timeout=60)
  return out.stdout.splitlines()[0] if out.stdout else ''


def library_path(name: str, cxx: str, cache_dir: Path | None = None) -> Path:
  """Where the build of kernel `name` by `cxx` for this CPU and jaxlib lives."""
  source = (_SOURCE_DIR / f'{name}.cc').read_bytes()
  headers = b''.join(h.read_bytes() for h in sorted(_SOURCE_DIR.glob('*.h')))
  key = hashlib.sha256()
  for part in (source, headers, ' '.join(flags()).encode(), _compiler_version(cxx).encode(),
               jaxlib.__version__.encode(), platform.machine().encode(), _cpu_fingerprint().encode()):
    key.update(hashlib.sha256(part).digest())
  from specjax.checkpoints import weight_cache  # pylint: disable=g-import-not-at-top (models import this)
  root = (cache_dir or weight_cache.default_cache_dir()) / SUBDIR
  return root / f'{name}-{key.hexdigest()[:24]}.so'


def compile_library(name: str, cxx: str, out: Path) -> Path:
  """Builds `<name>.cc` into `out`, atomically; raises KernelBuildError with the compiler's words."""
  out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
  tmp = out.with_name(f'.{out.name}.{uuid.uuid4().hex}.tmp')
  cmd = [cxx, *flags(), '-I', jax.ffi.include_dir(), str(_SOURCE_DIR / f'{name}.cc'), '-o', str(tmp)]
  try:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise KernelBuildError(f'cannot run {cxx}: {e}') from e
  if result.returncode != 0:
    tmp.unlink(missing_ok=True)
    errors = [l for l in result.stderr.splitlines() if 'error' in l][:5] or result.stderr.splitlines()[-5:]
    raise KernelBuildError(f'{" ".join(cmd)} failed ({result.returncode}):\n' + '\n'.join(errors))
  os.replace(tmp, out)
  return out


@functools.cache
def load(name: str, targets: tuple[str, ...]) -> bool:
  """Builds (or finds) kernel `name` and registers its FFI `targets` for CPU; False where it cannot.

  Once per process: the answer, and the reason for a False, are logged once.
  """
  if not enabled():
    logging.info('specjax CPU kernels off ($%s=%s): XLA kernels only',
                 DISABLE_ENV, os.environ[DISABLE_ENV])
    return False
  cxx = find_compiler()
  if cxx is None:
    logging.warning('no C++ compiler found (set $%s, or install g++ or clang++): the %s kernel '
                    'is not built, and XLA\'s slower kernels are used instead', CXX_ENV, name)
    return False
  try:
    path = library_path(name, cxx)
    if not path.exists():
      logging.info('building the %s CPU kernel with %s into %s', name, cxx, path)
      compile_library(name, cxx, path)
    library = ctypes.cdll.LoadLibrary(str(path))
    for target in targets:
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, target)), platform='cpu')
  except (KernelBuildError, OSError, AttributeError) as e:
    logging.warning('the %s CPU kernel is not available, XLA\'s slower kernels are used '
                    'instead: %s', name, e)
    return False
  return True


def supported(name: str, targets: tuple[str, ...], supported_target: str) -> bool:
  """Whether kernel `name` is built and registered (`load`) and its `supported_target` (an FFI
  call of no operands returning an int32) says this build on this CPU has its fast path."""
  if jax.default_backend() != 'cpu' or not load(name, targets):
    return False
  call = jax.ffi.ffi_call(supported_target, jax.ShapeDtypeStruct((), jnp.int32))
  with jax.ensure_compile_time_eval():   # a value now, even when first asked inside a trace
    return bool(call())
