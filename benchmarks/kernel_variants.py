"""Compiling an edited copy of one of specjax's CPU kernels as a kernel of its own.

The variant benchmarks (`skinny_matmul_variants.py`, `q8_matmul_variants.py`) time
copies of a kernel's source side by side in one process. Each copy is compiled
here with the product's flags (`cpu_kernels/build.py`) and its FFI handlers
renamed, so that every copy registers as its own XLA target.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
import subprocess
import time
from typing import Callable, Sequence

import jax

from specjax.cpu_kernels import build


def compile_variant(source: Path, renames: dict[str, str], workdir: Path,
                    index: int) -> ctypes.CDLL:
  """`source` with each handler name in `renames` replaced by its new name, compiled and
  loaded; exits with the compiler's message where it does not compile."""
  text = source.read_text()
  for old, new in renames.items():
    text = text.replace(old, new)
  renamed = workdir / f'variant_{index}.cc'
  renamed.write_text(text)
  library = workdir / f'variant_{index}.so'
  cmd = [build.find_compiler() or 'c++', *build.flags(), '-I', jax.ffi.include_dir(),
         '-I', str(build._SOURCE_DIR), str(renamed), '-o', str(library)]  # pylint: disable=protected-access
  result = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if result.returncode != 0:
    raise SystemExit(f'{source} does not compile:\n{result.stderr[-2000:]}')
  return ctypes.cdll.LoadLibrary(str(library))


def register(library: ctypes.CDLL, name: str) -> str:
  """Registers `library`'s handler `name` as the CPU FFI target of that name; returns it."""
  jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, name)), platform='cpu')
  return name


def in_turns(calls: Sequence[Callable[[], jax.Array]], rounds: int) -> list[list[float]]:
  """Seconds of each call in each of `rounds` rounds, every call once a round in turn, so
  that a slow spell of the machine falls on all of them alike."""
  seconds = [[] for _ in calls]
  for _ in range(rounds):
    for call, times in zip(calls, seconds):
      start = time.perf_counter()
      call().block_until_ready()
      times.append(time.perf_counter() - start)
  return seconds
