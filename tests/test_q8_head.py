"""The tied head from its Q8_0 form: the kernel's bits, the exact split of a table, and the model."""

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.cpu_kernels import q8_matmul
from specjax.cpu_kernels import skinny_matmul
from specjax.decoding import autoregressive, speculative
from specjax.drafters import make_drafter
from specjax.models import config as config_lib
from specjax.models import gemma, q8_head
from specjax.models.language_model import LanguageModel
from toy_models import q8_exact


def test_the_kernel_builds_here():
  assert q8_matmul.available(), 'the q8_matmul kernel did not build: see the warning logged above'


def test_gguf_blocks_split_into_the_values_gguf_dequantizes_to():
  rng = np.random.default_rng(0)
  w_OxI = rng.normal(size=(40, 96)).astype(np.float32)
  blocks = gguf.quants.quantize(w_OxI, gguf.GGMLQuantizationType.Q8_0)
  q_OxI, scale_OxB = q8_matmul.from_gguf_blocks(blocks, 96)
  assert q_OxI.dtype == np.int8 and scale_OxB.shape == (40, 3)
  expected = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0).reshape(40, 96)
  assert np.array_equal(np.asarray(q8_matmul.dequantize(q_OxI, scale_OxB)), expected)


# (rows, out, in): one group of up to 12 rows, two even ones past that (13: 7 + 6, 20:
# 10 + 10), outs that leave partial row blocks, panels and chunks.
SHAPES = [(1, 7, 32), (1, 1000, 640), (2, 97, 640), (3, 50, 96), (5, 4099, 640), (8, 300, 256),
          (9, 97, 640), (12, 301, 640), (13, 5000, 64), (16, 301, 640), (20, 97, 640)]


@pytest.mark.parametrize('rows,out,inner', SHAPES)
def test_equals_the_float32_kernel_on_the_dequantized_matrix_bit_for_bit(rows, out, inner):
  rng = np.random.default_rng(rows * out + inner)
  w_OxI = q8_exact(rng.normal(size=(out, inner)))
  q_OxI, scale_OxB = q8_head.q8_form(w_OxI)
  x_NxI = rng.normal(size=(rows, inner)).astype(np.float32)
  got = np.asarray(jax.jit(q8_matmul.q8_matmul)(x_NxI, q_OxI, scale_OxB))
  assert got.shape == (rows, out) and got.dtype == np.float32
  assert np.array_equal(got, np.asarray(jax.jit(skinny_matmul.skinny_matmul)(x_NxI, w_OxI)))
  expected = x_NxI.astype(np.float64) @ w_OxI.astype(np.float64).T
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner))
  for n in range(rows):  # whatever the number of rows, block or thread
    alone = np.asarray(jax.jit(q8_matmul.q8_matmul)(x_NxI[n:n + 1], q_OxI, scale_OxB))[0]
    assert np.array_equal(got[n], alone), f'row {n} of {rows} differs from itself alone'


def test_a_bad_operand_is_named():
  with pytest.raises(ValueError, match='multiple of 32'):
    q8_matmul.q8_matmul(jnp.ones((2, 40)), jnp.ones((5, 40), jnp.int8), jnp.ones((5, 1)))
  with pytest.raises(ValueError, match=r'int8 q\[O, I\]'):
    q8_matmul.q8_matmul(jnp.ones((2, 64)), jnp.ones((5, 64)), jnp.ones((5, 2)))


def test_a_q8_table_splits_back_exactly_and_any_other_does_not():
  rng = np.random.default_rng(1)
  table = q8_exact(rng.normal(size=(300, 64)))
  table[7, :32] = 0.0  # an all-zero block has scale 0
  q, scale = q8_head.q8_form(table)
  assert np.array_equal(np.asarray(q8_matmul.dequantize(q, scale)), table)
  assert scale[7, 0] == 0 and not q[7, :32].any()
  assert q8_head.q8_form(rng.normal(size=(300, 64)).astype(np.float32)) is None  # float32
  off = table.copy()
  off[299, 63] = np.nextafter(off[299, 63], np.float32(np.inf))  # one weight one ulp away
  assert q8_head.q8_form(off) is None
  assert q8_head.q8_form(table[:, :48]) is None  # rows that are not whole blocks
  assert q8_head.q8_form(np.where(table == table[0, 0], np.nan, table)) is None


def _q8_tiny(seed=0, **overrides):
  cfg = config_lib.tiny_config(**overrides)
  params = gemma.init_params(cfg, jax.random.key(seed))
  params = jax.tree.map(lambda x: x * 1.5, params)
  params = {**params, 'embedding_VxD': jnp.asarray(q8_exact(params['embedding_VxD']))}
  return cfg, params, q8_head.with_q8_head(params)


def test_with_q8_head_adds_the_form_only_where_exact():
  cfg, params, with_q8 = _q8_tiny()
  assert sorted(set(with_q8) - set(params)) == [q8_head.HEAD_Q8, q8_head.HEAD_SCALE]
  plain = gemma.init_params(cfg, jax.random.key(0))
  assert q8_head.with_q8_head(plain) is plain


@pytest.mark.parametrize('length', [1, 2, 5, 9, 16, 20, 21])
def test_the_model_gives_the_same_logits_from_the_q8_form(length):
  # 2 to 15 rows: the float32 path is the skinny kernel, so the logits are the same bits;
  # at 1 row it is XLA's GEMV and from 16 XLA's product (the q8 kernel takes 1 to 20).
  cfg, params, with_q8 = _q8_tiny()
  model = LanguageModel(cfg)
  tokens = jnp.arange(3, 3 + length)[None] % cfg.vocab_size
  positions = jnp.arange(length)[None]
  run = jax.jit(lambda p: model.forward(p, tokens, positions, model.init_cache(1, 32)))
  plain, quant = run(params), run(with_q8)
  text = jax.jit(lambda p: model.forward(p, tokens, positions, model.init_cache(1, 32))
                 ).lower(with_q8).as_text()
  assert (q8_matmul.TARGET in text) == (length <= q8_matmul.MAX_ROWS)
  if 2 <= length <= skinny_matmul.MAX_ROWS:
    assert np.array_equal(np.asarray(plain.logits_BxRxV), np.asarray(quant.logits_BxRxV))
  np.testing.assert_allclose(quant.logits_BxRxV, plain.logits_BxRxV, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree.leaves(plain.cache), jax.tree.leaves(quant.cache)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize('drafter', ['ngram', 'early_exit'])
def test_speculative_greedy_from_the_q8_head_equals_autoregressive(drafter):
  cfg, params, with_q8 = _q8_tiny(seed=3)
  model = LanguageModel(cfg)
  prompts = [[5, 9, 3], [7, 1, 2, 8, 4, 6, 1, 2, 30, 31, 33], [11], [3, 3, 5, 2, 9]]
  ref = autoregressive.generate(model, params, prompts, max_new_tokens=16)
  ar = autoregressive.generate(model, with_q8, prompts, max_new_tokens=16)
  settings = {'layers': 2} if drafter == 'early_exit' else None
  spec = speculative.generate(model, with_q8, make_drafter(drafter, target=model,
                                                           settings=settings),
                              prompts, gamma=4, max_new_tokens=16)
  assert ar.new_tokens == ref.new_tokens
  assert spec.new_tokens == ar.new_tokens
