"""The CPU a benchmark ran on: model, cores and the vector extensions that move
XLA:CPU's matmul speed (AVX2, AVX-512, AMX), printed with every table."""

from __future__ import annotations

import os
import platform

_FLAGS_OF_INTEREST = ('avx', 'avx2', 'fma', 'f16c', 'avx512f', 'avx512bw', 'avx512_vnni',
                      'avx512_bf16', 'amx_bf16', 'amx_tile')


def describe() -> str:
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        key, _, value = line.partition(':')
        if key.strip() == 'model name':
          model = value.strip()
        elif key.strip() == 'flags':
          flags = set(value.split())
  except OSError:
    pass
  shown = [f for f in _FLAGS_OF_INTEREST if f in flags]
  line = f'CPU: {model}, {os.cpu_count()} cores, flags: {" ".join(shown) or "unknown"}'
  return line + _narrowed()


def _narrowed() -> str:
  """A second line where this run uses less of the CPU than it has: XLA's code
  generation capped (`--xla_cpu_max_isa`) or specjax's kernels built for an older
  target ($SPECJAX_CPU_KERNELS_MARCH), as when measuring an AVX2-only build on an
  AVX-512 machine. Runtime-dispatched libraries are not capped, nor the memory system."""
  caps = [f for f in os.environ.get('XLA_FLAGS', '').split() if f.startswith('--xla_cpu_max_isa')]
  march = os.environ.get('SPECJAX_CPU_KERNELS_MARCH', '').strip()
  if march:
    caps.append(f'specjax kernels built with -march={march}')
  return '\nnarrowed: ' + ', '.join(caps) if caps else ''


if __name__ == '__main__':   # python benchmarks/cpu_info.py > cpu.txt, beside a sweep's tables
  print(describe())
