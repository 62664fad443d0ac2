"""The CPU attention kernel: right, the same bits per query whatever runs beside it, differentiable, used."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.cpu_kernels import attention as attention_lib
from specjax.cpu_kernels import build
from specjax.models import gemma
from specjax.models import kv_cache as kv_cache_lib
from specjax.models.config import GemmaConfig

import cpu_flags

# (B, T, K, G, H, S): head dims that leave a partial vector and block, caches
# that leave a partial slot chunk, several K/V heads, the 270M's own shape.
SHAPES = [(1, 1, 1, 4, 256, 1024), (1, 9, 1, 4, 256, 300), (2, 3, 2, 2, 8, 37),
          (3, 5, 1, 4, 20, 130), (2, 16, 3, 1, 5, 64), (4, 2, 1, 3, 48, 65)]


def _random_inputs(shape, seed, density=0.4):
  b, t, k, g, h, s = shape
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, t, k, g, h)).astype(np.float32) * h ** -0.5
  key = rng.normal(size=(b, s, k, h)).astype(np.float32)
  value = rng.normal(size=(b, s, k, h)).astype(np.float32)
  mask = rng.random((b, t, s)) < density
  mask[np.arange(b)[:, None], np.arange(t)[None], rng.integers(0, s, (b, t))] = True
  return q, key, value, mask


def _float64_attention(q, key, value, mask, softcap):
  logits = np.einsum('btkgh,bskh->bkgts', q.astype(np.float64), key.astype(np.float64))
  if softcap:
    logits = np.tanh(logits / softcap) * softcap
  logits = np.where(mask[:, None, None], logits, -np.inf)
  with np.errstate(invalid='ignore'):   # a query that sees nothing: NaN, not compared
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
  return np.einsum('bkgts,bskh->btkgh', probs, value.astype(np.float64))


def test_the_kernel_builds_here():
  # Not a skip: without the kernel every test below would test XLA instead.
  assert build.find_compiler(), 'no C++ compiler on PATH: install g++ or clang++, or set $CXX'
  assert attention_lib.available(), 'the attention kernel did not build: see the warning logged above'


@pytest.mark.parametrize('softcap', [None, 50.0])
@pytest.mark.parametrize('shape', SHAPES)
def test_equals_a_float64_attention(shape, softcap):
  q, key, value, mask = _random_inputs(shape, sum(shape))
  got = np.asarray(jax.jit(attention_lib.attention, static_argnums=4)(q, key, value, mask, softcap))
  np.testing.assert_allclose(got, _float64_attention(q, key, value, mask, softcap),
                             rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(got, attention_lib.xla_attention(q, key, value, mask, softcap),
                             rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('shape', [s for s in SHAPES if s[0] * s[1] > 1])
def test_each_query_is_bit_identical_to_that_query_alone(shape):
  # A decode step's token and the same token in a verify call, or in a batch:
  # the same sums in the same order, whatever else the call holds.
  q, key, value, mask = _random_inputs(shape, 7 + sum(shape))
  call = jax.jit(attention_lib.attention)
  together = np.asarray(call(q, key, value, mask))
  for b in range(shape[0]):
    for t in range(shape[1]):
      alone = np.asarray(call(q[b:b + 1, t:t + 1], key[b:b + 1], value[b:b + 1],
                              mask[b:b + 1, t:t + 1]))[0, 0]
      assert np.array_equal(together[b, t], alone), f'query ({b}, {t}) differs from itself alone'


def test_slots_no_query_may_see_are_never_read():
  # NaNs in every hidden slot, as stale memory could hold: the output is untouched.
  q, key, value, mask = _random_inputs((2, 4, 1, 4, 32, 200), 3, density=0.2)
  hidden = ~mask.any(axis=1)
  key[hidden], value[hidden] = np.nan, np.nan
  got = np.asarray(jax.jit(attention_lib.attention)(q, key, value, mask))
  assert np.isfinite(got).all()
  np.testing.assert_allclose(got, _float64_attention(q, np.nan_to_num(key), np.nan_to_num(value),
                                                     mask, None), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize('form', ['attention', 'xla_attention'])
def test_a_query_that_sees_no_slot_gets_zeros(form):
  # Both forms, so that the model's attention is one function whichever runs it.
  q, key, value, mask = _random_inputs((1, 3, 1, 2, 16, 70), 5)
  mask[0, 1] = False
  got = np.asarray(jax.jit(getattr(attention_lib, form))(q, key, value, mask))
  assert np.array_equal(got[0, 1], np.zeros_like(got[0, 1]))
  np.testing.assert_allclose(got[0, [0, 2]], _float64_attention(q, key, value, mask, None)[0, [0, 2]],
                             rtol=2e-5, atol=2e-6)


def test_gradients_equal_xla_attention():
  q, key, value, mask = (jnp.asarray(x) for x in _random_inputs((2, 3, 1, 2, 16, 40), 11))
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v, mask, None)))
  got = jax.grad(loss(attention_lib.attention), argnums=(0, 1, 2))(q, key, value)
  expected = jax.grad(loss(attention_lib.xla_attention), argnums=(0, 1, 2))(q, key, value)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


def test_vmap_maps_each_slice():
  q, key, value, mask = _random_inputs((3, 2, 1, 2, 16, 40), 13)
  per_row = jax.vmap(lambda q, k, v, m: attention_lib.attention(q[None], k[None], v[None], m[None])[0])
  got = np.asarray(per_row(q, key, value, mask))
  np.testing.assert_allclose(got, _float64_attention(q, key, value, mask, None), rtol=2e-5, atol=2e-6)


def _tiny_config(**overrides):
  base = dict(family='gemma3', num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2, head_dim=16,
              hidden_dim=64, vocab_size=97, sliding_window=8, global_every=2, use_qk_norm=True,
              max_position=256, rope_base_global=10_000.0, rope_base_local=10_000.0,
              query_pre_attn_scalar=16.0)
  base.update(overrides)
  return GemmaConfig(**base)


@pytest.mark.parametrize('new_tokens,dtype,takes_kernel', [
    (1, jnp.float32, True), (9, jnp.float32, True), (16, jnp.float32, True),
    (17, jnp.float32, False), (4, jnp.bfloat16, False)])
def test_the_model_takes_the_kernel_for_a_few_float32_tokens(new_tokens, dtype, takes_kernel):
  cfg = _tiny_config()
  params = gemma.init_params(cfg, jax.random.key(0), dtype)
  cache = kv_cache_lib.init(cfg, batch=2, num_slots=40, dtype=dtype)
  tokens = jnp.ones((2, new_tokens), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(new_tokens) + 3, (2, new_tokens))
  forward = lambda p, x, pos, c: gemma.Transformer(cfg).apply({'params': p}, x, pos, c).logits_BxRxV
  text = jax.jit(forward).lower(params, tokens, positions, cache).as_text()
  assert (attention_lib.TARGET in text) == takes_kernel


def test_the_model_with_the_kernel_equals_it_without(monkeypatch):
  # A decode step at every position of a prompt, past the local window, against
  # the same steps with XLA's attention (which reads the window alone).
  cfg = _tiny_config(attn_logit_softcap=20.0)
  params = gemma.init_params(cfg, jax.random.key(1))
  tokens = jax.random.randint(jax.random.key(2), (2, 30), 0, cfg.vocab_size)
  model = gemma.Transformer(cfg)

  def decode_all():
    cache = kv_cache_lib.init(cfg, batch=2, num_slots=32)
    step = jax.jit(lambda c, x, pos: model.apply({'params': params}, x, pos, c))
    out = []
    for i in range(30):
      result = step(cache, tokens[:, i:i + 1], jnp.full((2, 1), i, jnp.int32))
      cache = result.cache
      out.append(np.asarray(result.logits_BxRxV[:, 0]))
    return np.stack(out, 1)

  with_kernel = decode_all()
  monkeypatch.setattr(attention_lib, 'applies', lambda *a: False)
  without = decode_all()
  np.testing.assert_allclose(with_kernel, without, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not {'avx2', 'fma'} <= cpu_flags.flags(),
                    reason='this CPU cannot run a kernel built for AVX2')
def test_the_avx2_build_is_right_too():
  """The kernel built for AVX2 (`-march=haswell`: 8-lane vectors, its own sums across the
  accumulators), which an AVX-512 machine's suite never runs otherwise, passes the tests
  above in a process of its own."""
  code = '\n'.join([
      'from specjax.cpu_kernels import attention, build',
      'import test_attention_kernel as t',
      "assert '-march=haswell' in build.flags() and attention.available()",
      'for shape in t.SHAPES:',
      '  for softcap in (None, 50.0):',
      '    t.test_equals_a_float64_attention(shape, softcap)',
      '  if shape[0] * shape[1] > 1:',
      '    t.test_each_query_is_bit_identical_to_that_query_alone(shape)'])
  result = cpu_flags.run_under_march(code)
  assert result.returncode == 0, result.stderr[-3000:]
