"""The CPU skinny-matmul kernel: right, bit-identical per row, differentiable, and used."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.cpu_kernels import build
from specjax.cpu_kernels import skinny_matmul as sm
from specjax.models import gemma

# (rows, out, in): rows past a group of 8, outs that leave a partial row block,
# panel and chunk, ins that leave a partial vector (and one shorter than one).
SHAPES = [(1, 7, 3), (1, 1000, 640), (2, 97, 640), (3, 50, 17), (5, 4099, 640), (8, 300, 2048),
          (9, 97, 640), (13, 5000, 64), (16, 300, 2048), (16, 33, 1)]


def test_the_kernel_builds_here():
  # Not a skip: the suite's machines have a C++ compiler, and without the
  # kernel every test below would silently test XLA instead.
  assert build.find_compiler(), 'no C++ compiler on PATH: install g++ or clang++, or set $CXX'
  assert sm.available(), 'the skinny-matmul kernel did not build: see the warning logged above'


@pytest.mark.parametrize('rows,out,inner', SHAPES)
def test_equals_a_float64_matmul(rows, out, inner):
  rng = np.random.default_rng(rows * out + inner)
  x_NxI = rng.normal(size=(rows, inner)).astype(np.float32)
  w_OxI = rng.normal(size=(out, inner)).astype(np.float32)
  got = np.asarray(jax.jit(sm.skinny_matmul)(x_NxI, w_OxI))
  expected = x_NxI.astype(np.float64) @ w_OxI.astype(np.float64).T
  assert got.shape == (rows, out) and got.dtype == np.float32
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner))


@pytest.mark.parametrize('rows,out,inner', [s for s in SHAPES if s[0] > 1])
def test_each_row_is_bit_identical_to_that_row_alone(rows, out, inner):
  # Whatever the number of rows, block or thread, each element's sum is the same.
  rng = np.random.default_rng(rows + out + inner)
  x_NxI = rng.normal(size=(rows, inner)).astype(np.float32)
  w_OxI = rng.normal(size=(out, inner)).astype(np.float32)
  call = jax.jit(sm.skinny_matmul)
  together = np.asarray(call(x_NxI, w_OxI))
  for n in range(rows):
    alone = np.asarray(call(x_NxI[n:n + 1], w_OxI))[0]
    assert np.array_equal(together[n], alone), f'row {n} of {rows} differs from itself alone'


def test_gradients_equal_a_plain_matmul():
  rng = np.random.default_rng(0)
  x_NxI = jnp.asarray(rng.normal(size=(5, 40)).astype(np.float32))
  w_OxI = jnp.asarray(rng.normal(size=(70, 40)).astype(np.float32))
  loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
  got = jax.grad(loss(sm.skinny_matmul), argnums=(0, 1))(x_NxI, w_OxI)
  expected = jax.grad(loss(lambda x, w: x @ w.T), argnums=(0, 1))(x_NxI, w_OxI)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_vmap_maps_each_slice():
  rng = np.random.default_rng(1)
  x_MxNxI = rng.normal(size=(3, 4, 24)).astype(np.float32)
  w_OxI = rng.normal(size=(50, 24)).astype(np.float32)
  got = np.asarray(jax.vmap(sm.skinny_matmul, in_axes=(0, None))(x_MxNxI, w_OxI))
  np.testing.assert_allclose(got, x_MxNxI @ w_OxI.T, rtol=1e-5, atol=1e-5)


def _custom_calls(fn, *args) -> str:
  return jax.jit(fn).lower(*args).as_text()


@pytest.mark.parametrize('rows,dtype,takes_kernel', [
    (1, jnp.float32, False), (2, jnp.float32, True), (15, jnp.float32, True),
    (16, jnp.float32, False), (4, jnp.bfloat16, False)])
def test_linear_takes_the_kernel_for_few_float32_rows(rows, dtype, takes_kernel):
  x_1xTxI = jnp.ones((1, rows, 32), dtype)
  w_OxI = jnp.ones((24, 32), dtype)
  assert (sm.TARGET in _custom_calls(gemma.linear, x_1xTxI, w_OxI)) == takes_kernel
  got = jax.jit(gemma.linear)(x_1xTxI, w_OxI)
  assert got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), 32.0)


def test_the_head_at_5_positions_equals_each_position_in_a_call_of_2():
  # The tied head at 5 positions against each position beside another one, through
  # gemma (a single row is XLA's: MIN_ROWS).
  rng = np.random.default_rng(2)
  table_VxD = jnp.asarray(rng.normal(size=(5000, 64)).astype(np.float32))
  x_1x5xD = jnp.asarray(rng.normal(size=(1, 5, 64)).astype(np.float32))
  head = jax.jit(gemma.head_logits)
  together = np.asarray(head(x_1x5xD, table_VxD))
  for t in range(5):
    pair_1x2xD = x_1x5xD[:, [t, (t + 1) % 5]]
    assert np.array_equal(together[0, t], np.asarray(head(pair_1x2xD, table_VxD))[0, 0])


def test_a_failed_build_names_the_compiler_and_its_error(tmp_path):
  broken = tmp_path / 'c++'
  broken.write_text('#!/bin/sh\necho "c++: error: no such thing" >&2\nexit 3\n')
  broken.chmod(0o755)
  out = tmp_path / 'k.so'
  with pytest.raises(build.KernelBuildError, match=r'(?s)c\+\+.*failed \(3\).*no such thing'):
    build.compile_library('skinny_matmul', str(broken), out)
  assert not out.exists() and not list(tmp_path.glob('.k.so.*'))


def test_the_build_is_cached_by_what_decides_its_bits(tmp_path):
  cxx = build.find_compiler()
  path = build.library_path('skinny_matmul', cxx, tmp_path)
  assert path == build.library_path('skinny_matmul', cxx, tmp_path)
  assert path.parent == tmp_path / build.SUBDIR and path.name.startswith('skinny_matmul-')
  built = build.compile_library('skinny_matmul', cxx, path)
  assert built == path and path.stat().st_size > 0


def test_another_march_is_passed_to_the_compiler_and_named_apart(tmp_path, monkeypatch):
  recorder = tmp_path / 'c++'
  recorder.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/args\nexit 1\n')
  recorder.chmod(0o755)
  monkeypatch.delenv(build.MARCH_ENV, raising=False)  # the suite may run under another march
  native = build.library_path('skinny_matmul', str(recorder), tmp_path)
  monkeypatch.setenv(build.MARCH_ENV, 'haswell')
  assert build.library_path('skinny_matmul', str(recorder), tmp_path) != native
  with pytest.raises(build.KernelBuildError):
    build.compile_library('skinny_matmul', str(recorder), tmp_path / 'k.so')
  args = (tmp_path / 'args').read_text().split()
  assert '-march=haswell' in args and '-march=native' not in args


_WITHOUT_KERNEL = '''
import jax, jax.numpy as jnp
from absl import logging
logging.set_verbosity(logging.INFO)
from specjax.cpu_kernels import skinny_matmul as sm
from specjax.models import gemma
print('available', sm.available())
x, w = jnp.ones((1, 5, 16)), jnp.ones((7, 16))
print('kernel in program', sm.TARGET in jax.jit(gemma.linear).lower(x, w).as_text())
print('value', float(jax.jit(gemma.linear)(x, w)[0, 0, 0]))
'''


@pytest.mark.parametrize('env,reason', [
    ({build.DISABLE_ENV: '0'}, 'CPU kernels off'),
    ({build.CXX_ENV: '/nonexistent/c++'}, 'no C++ compiler found'),
])
def test_without_the_kernel_xla_computes_the_same_and_the_log_says_why(env, reason, tmp_path):
  environ = {**os.environ, **env, 'SPECJAX_CACHE_DIR': str(tmp_path)}
  result = subprocess.run([sys.executable, '-c', _WITHOUT_KERNEL], env=environ,
                          capture_output=True, text=True, timeout=300, check=True)
  assert 'available False' in result.stdout
  assert 'kernel in program False' in result.stdout
  assert 'value 16.0' in result.stdout
  assert reason in result.stderr
