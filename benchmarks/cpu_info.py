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
  return f'CPU: {model}, {os.cpu_count()} cores, flags: {" ".join(shown) or "unknown"}'
