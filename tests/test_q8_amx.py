"""Intel AMX tile products of int8 blocks: within their stated bound of the exact product, and
row n the same bits whatever the other rows, so a decode step and a verify call agree."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cpu_flags
from specjax.cpu_kernels import q8_amx
from specjax.models import config as config_lib
from specjax.models import gemma
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from toy_models import gguf_like_params


def _has_amx_build() -> bool:
  return (cpu_flags.native_build_with('amx_tile', 'amx_int8', 'avx512f', 'avx512vbmi')
          and jax.default_backend() == 'cpu')


def test_available_exactly_where_the_cpu_has_amx_int8():
  """Here the kernel must serve; where the CPU lacks AMX-INT8, callers must be told no."""
  assert q8_amx.available() == _has_amx_build()


needs_kernel = pytest.mark.skipif(not _has_amx_build(), reason='covered by the test above')


def _form(rng, out, inner, block=32, offset=False):
  """A matrix's int8 form as q8_weights makes them: Q8_0-like, or Q4_K-like with offsets."""
  if offset:
    q = rng.integers(0, 16, size=(out, inner)).astype(np.int8)
  else:
    q = rng.integers(-127, 128, size=(out, inner)).astype(np.int8)
  scale = (rng.uniform(0.5, 2.0, size=(out, inner // block)) * 1e-2).astype(np.float32)
  off = (rng.uniform(0.0, 0.1, size=(out, inner // block))).astype(np.float32) if offset else None
  return q, scale, off


def _weights64(q, scale, off):
  o, i = q.shape
  b = i // scale.shape[1]
  w = q.reshape(o, i // b, b).astype(np.float64) * scale[:, :, None]
  if off is not None:
    w = w - off[:, :, None]
  return w.reshape(o, i)


def _amx(x, q, scale, off):
  tiles = q8_amx.tile_form(q, scale, off)
  return np.asarray(jax.jit(q8_amx.q8_amx_matmul)(jnp.asarray(x), *tiles))


def _bound(x, w, block):
  """The .cc file's bound: x rounded to 22 bits of its block's largest magnitude (2^-22 of it
  at most an element), plus float32 rounding in the per-block sums and across blocks."""
  n, i = x.shape
  xb = np.abs(x.astype(np.float64)).reshape(n, i // block, block)
  wb = np.abs(w).reshape(w.shape[0], i // block, block)
  rounding = np.einsum('nb,obk->no', xb.max(-1), wb) * 2.0 ** -22
  magnitude = np.abs(x.astype(np.float64)) @ np.abs(w).T
  return rounding + (i // block + 4) * 2.0 ** -23 * magnitude


@needs_kernel
@pytest.mark.parametrize('rows,out,inner,block,offset', [
    (1, 256, 640, 32, False), (5, 1024, 640, 32, False), (9, 640, 2048, 16, False),
    (9, 640, 1024, 32, True), (24, 2048, 640, 32, False), (37, 64, 256, 16, False),
    (64, 640, 1024, 32, True)])
def test_the_product_is_within_its_bound_of_the_exact_one(rows, out, inner, block, offset):
  rng = np.random.default_rng(rows * out + inner)
  q, scale, off = _form(rng, out, inner, block, offset)
  x = rng.normal(size=(rows, inner)).astype(np.float32)
  x[:, rng.integers(0, inner, size=3)] *= 100.0     # a few large features, as Gemma's have
  w = _weights64(q, scale, off)
  err = np.abs(_amx(x, q, scale, off) - x.astype(np.float64) @ w.T)
  bound = _bound(x, w, block)
  assert (err <= bound).all(), float((err / bound).max())


@needs_kernel
def test_dropping_x_below_22_bits_would_fail_the_bound():
  """The negative control of the bound: x rounded to 14 bits of its block maximum (two bytes)
  lands outside it, so the bound above can tell a kernel that keeps too few bits."""
  rng = np.random.default_rng(3)
  q, scale, off = _form(rng, 512, 640)
  x = rng.normal(size=(4, 640)).astype(np.float32)
  blocks = np.abs(x).reshape(4, 20, 32).max(-1, keepdims=True)
  step = 2.0 ** (np.floor(np.log2(blocks)) + 1 - 14)
  coarse = (np.round(x.reshape(4, 20, 32) / step) * step).reshape(4, 640)
  w = _weights64(q, scale, off)
  err = np.abs(coarse @ w.T - x.astype(np.float64) @ w.T)
  assert (err > _bound(x, w, 32)).any()


@needs_kernel
def test_a_row_is_the_same_bits_whatever_the_other_rows():
  rng = np.random.default_rng(7)
  q, scale, off = _form(rng, 1024, 640)
  x = rng.normal(size=(64, 640)).astype(np.float32) * rng.uniform(0.01, 100, size=(64, 1))
  x = x.astype(np.float32)
  whole = _amx(x, q, scale, off)
  for n in (1, 3, 5, 9, 17, 40):
    assert np.array_equal(_amx(x[:n], q, scale, off), whole[:n])
  order = rng.permutation(64)
  assert np.array_equal(_amx(x[order], q, scale, off), whole[order])
  for n in (0, 13, 63):
    assert np.array_equal(_amx(x[n:n + 1], q, scale, off)[0], whole[n])
  # More rows than a call takes: calls of 64, each row still its own bits.
  many = np.concatenate([x, x[order][:36]])
  assert np.array_equal(_amx(many, q, scale, off), np.concatenate([whole, whole[order][:36]]))


@needs_kernel
def test_zero_tiny_huge_and_non_finite_rows():
  rng = np.random.default_rng(11)
  q, scale, off = _form(rng, 256, 128, offset=True)
  w = _weights64(q, scale, off)
  x = rng.normal(size=(6, 128)).astype(np.float32)
  x[0] = 0.0
  x[1] *= 1e-41                      # subnormal floats
  x[2] *= 2.0 ** 110                 # past 2^100: the float path
  x[3, 5] = np.nan
  x[4, 7] = np.inf
  got = _amx(x, q, scale, off)
  assert np.array_equal(got[0], np.zeros(256, np.float32))
  # subnormal results may flush to zero (as float32 arithmetic with FTZ, XLA:CPU's, does)
  np.testing.assert_allclose(got[1], (x[1].astype(np.float64) @ w.T), rtol=0, atol=2.0 ** -126)
  # float32 sums in order of i: within I * 2^-24 of the magnitude
  exact2 = x[2].astype(np.float64) @ w.T
  magnitude = np.abs(x[2]).astype(np.float64) @ np.abs(w).T
  assert (np.abs(got[2] - exact2) <= 128 * 2.0 ** -24 * magnitude).all()
  assert np.isnan(got[3]).all()
  with np.errstate(invalid='ignore'):
    want_inf = np.float32(np.inf) * w[:, 7].astype(np.float32)   # +-inf, or NaN where w is 0
  assert np.array_equal(np.isnan(got[4]), np.isnan(want_inf))
  finite = ~np.isnan(want_inf)
  assert np.array_equal(got[4][finite], want_inf[finite])
  assert np.array_equal(got[5], _amx(x[5:6], q, scale, off)[0])   # its neighbours do not matter


@needs_kernel
def test_bad_operands_are_named():
  rng = np.random.default_rng(0)
  q, scale, _ = _form(rng, 64, 128)
  tiles, tile_scale, _ = q8_amx.tile_form(q, scale)
  with pytest.raises(ValueError, match='q8_amx_matmul: expected float32 x'):
    q8_amx.q8_amx_matmul(jnp.ones((2, 64), jnp.float32), tiles, tile_scale)
  with pytest.raises(ValueError, match='q8_amx_matmul: expected float32 x'):
    q8_amx.q8_amx_matmul(jnp.ones((2, 128), jnp.bfloat16), tiles, tile_scale)


def test_the_tile_layout_holds_the_matrix():
  rng = np.random.default_rng(1)
  q, scale, off = _form(rng, 48, 64, block=16, offset=True)
  tiles, tile_scale, tile_offset = q8_amx.tile_form(q, scale, off)
  assert tiles.shape == (3, 64 * 16) and tile_scale.shape == (3, 4 * 16)
  back = tiles.reshape(3, 16, 16, 4).transpose(0, 2, 1, 3).reshape(48, 64)
  assert np.array_equal(back, q)
  assert np.array_equal(tile_scale.reshape(3, 4, 16).transpose(0, 2, 1).reshape(48, 4), scale)
  assert np.array_equal(tile_offset.reshape(3, 4, 16).transpose(0, 2, 1).reshape(48, 4), off)
  assert q8_amx.tile_form(q[:40], scale[:40]) is None          # 40 outputs: not whole tiles
  assert q8_amx.tile_form(q[:, :48], scale[:, :2]) is None    # 24 weights a block


@needs_kernel
@pytest.mark.parametrize('batch,length', [(1, 1), (1, 9), (4, 5), (8, 8), (13, 5), (16, 9),
                                          (20, 13)])
def test_the_model_takes_amx_products_up_to_its_row_limit(batch, length):
  """Every layer matrix takes q8_amx up to its row limit, in calls of 64 rows (the head stays
  q8_matmul's), and the logits stay within float32 rounding of the float32 model's."""
  cfg = config_lib.tiny_config()
  params = gguf_like_params(jax.tree.map(lambda x: x * 1.5,
                                         gemma.init_params(cfg, jax.random.key(2))))
  with_q8 = q8_weights.with_q8_weights(params)
  model = LanguageModel(cfg)
  rng = np.random.default_rng(batch * length)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, size=(batch, length)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  run = jax.jit(lambda p: model.forward(p, tokens, positions, model.init_cache(batch, 32)))
  text = run.lower(with_q8).as_text()
  calls = text.count(f'@{q8_amx.TARGET}(') + text.count(f'@{q8_amx.OFFSET_TARGET}(')
  rows = batch * length
  chunks = -(-rows // q8_amx.MAX_ROWS) if rows <= q8_amx.MAX_SPLIT_ROWS else 0
  assert calls == 7 * cfg.num_layers * chunks
  # logits of magnitude 1 to 5: x rounded to 22 bits of its block maximum moves them by
  # 1.4e-5 at most here (q8_matmul's float32 sums, test_q8_weights: 1e-5)
  np.testing.assert_allclose(run(with_q8).logits_BxRxV, run(params).logits_BxRxV,
                             rtol=1e-5, atol=5e-5)
