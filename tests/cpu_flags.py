"""Which of specjax's CPU kernel paths this machine's build must have: tests compare each
kernel's `available()` with this, so a kernel silently off where the CPU has its instructions
fails a test instead of skipping one."""

import os
import subprocess
import sys
from pathlib import Path

from specjax.cpu_kernels import build


def flags() -> set[str]:
  for line in Path('/proc/cpuinfo').read_text().splitlines():
    if line.startswith('flags'):
      return set(line.split(':', 1)[1].split())
  return set()


def native_build_with(*needed: str) -> bool:
  """Whether the kernels are built for this CPU (not an older target, not turned off) and it
  has every flag in `needed`."""
  native = os.environ.get(build.MARCH_ENV, '').strip() in ('', 'native')
  return native and build.enabled() and set(needed) <= flags()


def run_under_march(code: str, march: str = 'haswell') -> subprocess.CompletedProcess:
  """Python `code` in a process of its own whose kernels are built for `march` (the tests'
  directory importable): an AVX-512 machine's suite otherwise runs only its native build."""
  env = dict(os.environ, **{build.MARCH_ENV: march})
  env['PYTHONPATH'] = os.pathsep.join([os.path.dirname(__file__), env.get('PYTHONPATH', '')])
  return subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                        timeout=600, check=False)
