#!/bin/bash
# Builds head_from_memory.cc against each kernel source named (copies of
# specjax/cpu_kernels/skinny_matmul.cc, edited) and runs them in turns, twice.
#   MARCH=haswell bash run_variants.sh /tmp/a.cc /tmp/b.cc
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
inc=$("$repo/.venv/bin/python" -c 'import jax; print(jax.ffi.include_dir())')
out=$(mktemp -d)
for f in "$@"; do
  c++ -O3 -std=gnu++17 -ffp-contract=off -march="${MARCH:-native}" -pthread -I "$inc" \
    -I "$repo/specjax/cpu_kernels" -DKERNEL_SOURCE="\"$(realpath "$f")\"" -DNAME="\"$(basename "$f")\"" \
    "$here/head_from_memory.cc" -o "$out/$(basename "${f%.cc}")"
done
for turn in 1 2; do for f in "$@"; do "$out/$(basename "${f%.cc}")"; done; done
