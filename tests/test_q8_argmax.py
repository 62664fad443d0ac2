"""The head's argmax from its int8 blocks: the same index and value as q8_matmul's logits, always."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cpu_flags
from specjax.cpu_kernels import q8_argmax
from specjax.cpu_kernels import q8_matmul


def _has_kernel_build() -> bool:
  # The first pass is built with AVX-512 VNNI, else with AVX2 (every VNNI CPU has AVX2).
  return cpu_flags.native_build_with('avx2', 'fma')


def test_available_exactly_where_the_cpu_has_avx2():
  """Here the fast path must be built; where the CPU lacks it, callers must be told no."""
  assert q8_argmax.available() == _has_kernel_build()


needs_kernel = pytest.mark.skipif(not _has_kernel_build(), reason='covered by the test above')


def _has_screen_build() -> bool:
  return _has_kernel_build() and cpu_flags.native_build_with('amx_tile', 'amx_int8',
                                                              'avx512vbmi', 'avx512_vnni')


def test_the_screen_is_available_exactly_where_the_cpu_has_amx_int8():
  assert q8_argmax.screen_available() == _has_screen_build()


needs_screen = pytest.mark.skipif(not _has_screen_build(), reason='covered by the test above')
# Each test of the answer runs on both first passes: the VNNI pass over the form's tiles (the
# AVX2 pass where the build has no AVX-512 VNNI: `test_the_avx2_build_is_right_too`), and the
# AMX screen over its own table.
KINDS = [pytest.param('vnni', marks=needs_kernel), pytest.param('screen', marks=needs_screen)]


def _head(rng, out, inner, block=32, spread=1.0):
  q = rng.integers(-127, 128, size=(out, inner)).astype(np.int8)
  scale = (rng.uniform(0.5, 2.0, size=(out, inner // block)) * 1e-3 * spread).astype(np.float32)
  return q, scale


def _both(x, q, scale, kind='vnni'):
  if kind == 'vnni':
    got_i, got_v = jax.jit(q8_argmax.head_argmax)(jnp.asarray(x), *q8_argmax.tile_form(q, scale),
                                                  q, scale)
  else:
    got_i, got_v = jax.jit(q8_argmax.screen_argmax)(jnp.asarray(x),
                                                    *q8_argmax.screen_form(q, scale), q, scale)
  logits = np.asarray(jax.jit(q8_matmul.q8_matmul)(jnp.asarray(x), q, scale))
  want_i = np.asarray(jnp.argmax(jnp.asarray(logits), axis=-1))
  return np.asarray(got_i), np.asarray(got_v), want_i, logits[np.arange(len(x)), want_i]


SHAPES = [(1, 4096, 640, 32), (5, 4096, 640, 32), (9, 1024, 640, 16), (13, 512, 64, 32),
          (17, 512, 640, 32), (20, 2048, 640, 32), (36, 256, 128, 16), (64, 1024, 640, 32),
          (144, 512, 640, 32)]


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('rows,out,inner,block', SHAPES)
def test_the_index_and_value_of_q8_matmuls_maximum(rows, out, inner, block, kind):
  rng = np.random.default_rng(rows * out + inner)
  q, scale = _head(rng, out, inner, block)
  x = rng.normal(size=(rows, inner)).astype(np.float32)
  x[:, rng.integers(0, inner, size=3)] *= 40.0     # a few large features, as Gemma's have
  got_i, got_v, want_i, want_v = _both(x, q, scale, kind)
  assert np.array_equal(got_i, want_i)
  assert np.array_equal(got_v, want_v)            # the same float32 bits


@pytest.mark.parametrize('kind', KINDS)
def test_ties_and_near_ties_give_the_first_index(kind):
  rng = np.random.default_rng(1)
  q, scale = _head(rng, 1024, 640)
  x = rng.normal(size=(6, 640)).astype(np.float32)
  logits = np.asarray(q8_matmul.q8_matmul(jnp.asarray(x), q, scale))
  best = logits.argmax(1)
  for n in range(len(x)):   # copy each row's best head row to two places, one before it
    for o in (best[n] // 3, best[n] + 1 if best[n] + 1 < 1024 else 0):
      q[o], scale[o] = q[best[n]], scale[best[n]]
  # and one row a single step of q away from row 7's copy, where x is smallest
  i = int(np.abs(x[0]).argmin())
  q[7], scale[7] = q[best[0]], scale[best[0]]
  q[7, i] = q[7, i] + (1 if q[7, i] < 127 else -1)
  got_i, got_v, want_i, want_v = _both(x, q, scale, kind)
  assert np.array_equal(got_i, want_i) and np.array_equal(got_v, want_v)
  assert all(got_i[n] <= best[n] // 3 for n in range(len(x)))   # the first of the tied rows


@pytest.mark.parametrize('kind', KINDS)
def test_every_row_a_candidate_and_rows_that_are_not_finite(kind):
  """x = 0 makes every logit 0 (index 0 after all 2048 are candidates); NaN and inf take every
  logit, as jnp.argmax over the logits does (the first NaN wins)."""
  rng = np.random.default_rng(2)
  q, scale = _head(rng, 2048, 640)
  x = rng.normal(size=(5, 640)).astype(np.float32)
  x[0] = 0.0
  x[1, 3] = np.nan
  x[2, 10] = np.inf
  x[3, :] = 1e-30       # tiny inputs: steps far below a float16's (the screen's bound holds)
  x[4, :] = 1e-35       # max|x| under 2^-100: the screen takes every logit
  got_i, got_v, want_i, want_v = _both(x, q, scale, kind)
  assert np.array_equal(got_i, want_i)
  assert np.array_equal(got_v, want_v, equal_nan=True)
  assert got_i[0] == 0 and np.isnan(got_v[1])
  # More candidates than the scan keeps before compacting its list (4,096 a row): every one
  # of 20,000 rows, and, in a second row, the 1,000 rows one scale apart from the best.
  q, scale = _head(rng, 20000, 64)
  scale[:] = 1e-3
  q[:, :] = 1
  q[5000:6000, 0] = 2
  x = np.zeros((2, 64), np.float32)
  x[1, 0] = 1e-3
  got_i, got_v, want_i, want_v = _both(x, q, scale, kind)
  assert list(got_i) == list(want_i) == [0, 5000] and np.array_equal(got_v, want_v)


@needs_kernel
def test_bad_operands_are_named():
  rng = np.random.default_rng(3)
  q, scale = _head(rng, 64, 64)
  tiles = q8_argmax.tile_form(q, scale)
  with pytest.raises(Exception, match='q8_argmax: expected'):
    q8_argmax.head_argmax(jnp.ones((2, 32), jnp.float32), *tiles, q, scale)
  assert q8_argmax.tile_form(q[:40], scale[:40]) is None    # rows not a multiple of 16


def test_the_tile_form_holds_the_head():
  rng = np.random.default_rng(4)
  q, scale = _head(rng, 48, 64, block=16)
  tiles, tile_scale, l1max = q8_argmax.tile_form(q, scale)
  assert tiles.shape == (3, 64 * 16) and tiles.dtype == np.uint8
  back = (tiles.reshape(3, 16, 16, 4).astype(np.int16) - 128).transpose(0, 2, 1, 3).reshape(48, 64)
  assert np.array_equal(back, q)
  assert np.array_equal(tile_scale.reshape(3, 4, 16).transpose(0, 2, 1).reshape(48, 4), scale)
  l1 = (np.abs(q.astype(np.float64)).reshape(48, 4, 16).sum(-1) * scale).max(1)
  assert np.all(l1max.reshape(48) >= l1) and np.allclose(l1max.reshape(48), l1, rtol=1e-6)


def _rounding_trap():
  """A head whose row 1 has the larger logit but the smaller screen logit: each row's
  largest weight (127 s, at an input x leaves at 0) sets its screen scale to s, and row 0's
  0.51 s rounds up to s where row 1's 0.49 s and 0.04 s round down to 0."""
  q = np.zeros((16, 64), np.int8)
  scale = np.full((16, 2), 1e-4, np.float32)
  scale[:, 0] = 1e-2
  q[:, 0] = 127
  q[0, 32] = 51
  q[1, 32], q[1, 33] = 49, 4
  x = np.zeros((1, 64), np.float32)
  x[0, 32] = x[0, 33] = 1.0
  return q, scale, x


@needs_screen
def test_the_screens_bound_keeps_a_row_its_rounding_put_behind():
  q, scale, x = _rounding_trap()
  got_i, got_v, want_i, want_v = _both(x, q, scale, 'screen')
  assert list(want_i) == [1] and list(got_i) == [1] and np.array_equal(got_v, want_v)
  # Negative control: without the bound (l1 and err zero) the screen keeps row 0 alone.
  screen, meta = q8_argmax.screen_form(q, scale)
  meta = meta.copy()
  meta[:, 16:] = 0.0
  got_i, _ = jax.jit(q8_argmax.screen_argmax)(jnp.asarray(x), screen, meta, q, scale)
  assert list(np.asarray(got_i)) == [0]


@needs_screen
def test_bad_screen_operands_are_named():
  rng = np.random.default_rng(5)
  q, scale = _head(rng, 64, 64)
  screen, meta = q8_argmax.screen_form(q, scale)
  with pytest.raises(Exception, match='q8_argmax screen: expected'):
    q8_argmax.screen_argmax(jnp.ones((2, 64), jnp.float32), screen, meta[:, :16], q, scale)
  assert q8_argmax.screen_form(q[:, :48], scale[:, :1]) is None    # inputs not a multiple of 64


def test_the_screen_form_rounds_the_head_within_its_stated_error():
  rng = np.random.default_rng(6)
  q, scale = _head(rng, 48, 128, block=16)
  scale[5] = 0.0                                   # a row of zeros
  screen, meta = q8_argmax.screen_form(q, scale)
  assert screen.shape == (3, 128 * 16) and screen.dtype == np.int8 and meta.shape == (3, 48)
  r = screen.reshape(3, 32, 16, 4).transpose(0, 2, 1, 3).reshape(48, 128).astype(np.float64)
  s, l1, err = (meta.reshape(3, 3, 16).transpose(1, 0, 2).reshape(3, 48)).astype(np.float64)
  w = (q.astype(np.float32).reshape(48, 8, 16) * scale[:, :, None]).reshape(48, 128)
  w = w.astype(np.float64)
  assert np.array_equal(s, (np.abs(w).max(1) / 127).astype(np.float32))
  assert np.all(np.abs(r) <= 127)
  assert np.all(np.abs(w - s[:, None] * r).max(1) <= err)
  assert np.all(err <= s / 2 * (1 + 1e-6))
  assert np.all(np.abs(w).sum(1) <= l1) and np.allclose(l1, np.abs(w).sum(1), rtol=1e-6)
  assert np.all(r[5] == 0) and s[5] == 0 and err[5] == 0


@pytest.mark.skipif(not {'avx2', 'fma'} <= cpu_flags.flags(),
                    reason='this CPU cannot run a kernel built for AVX2')
def test_the_avx2_build_is_right_too():
  """The first pass built for AVX2 (`-march=haswell`: |q| by x with q's sign, byte products
  added into int16 pairs), which an AVX-512 machine's suite never runs otherwise, passes the
  tests above in a process of its own: the same index and value as q8_matmul's logits."""
  code = '\n'.join([
      'from specjax.cpu_kernels import build, q8_argmax',
      'import test_q8_argmax as t',
      "assert '-march=haswell' in build.flags() and q8_argmax.available()",
      "assert not q8_argmax.screen_available()",
      'for shape in t.SHAPES:',
      "  t.test_the_index_and_value_of_q8_matmuls_maximum(*shape, 'vnni')",
      "t.test_ties_and_near_ties_give_the_first_index('vnni')",
      "t.test_every_row_a_candidate_and_rows_that_are_not_finite('vnni')",
      't.test_bad_operands_are_named()'])
  result = cpu_flags.run_under_march(code)
  assert result.returncode == 0, result.stderr[-3000:]
