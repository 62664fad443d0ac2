"""Matrices from their int8 blocks: the kernel's bits, the exact split of a matrix, and the model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sharding
from specjax.cpu_kernels import q8_amx
from specjax.cpu_kernels import q8_argmax
from specjax.cpu_kernels import q8_matmul
from specjax.cpu_kernels import skinny_matmul
from specjax.decoding import autoregressive, speculative
from specjax.drafters import eagle, eagle_net, make_drafter, medusa
from specjax.models import config as config_lib
from specjax.models import gemma, q8_weights
from specjax.models.language_model import LanguageModel
from toy_models import gguf_exact, gguf_like_params


def test_the_kernel_builds_here():
  assert q8_matmul.available(), 'the q8_matmul kernel did not build: see the warning logged above'


# (rows, out, in): one group of up to 9 rows, even ones past that (12: 6 + 6, 13: 7 + 6, 20:
# 7 + 7 + 6), outs that leave partial row blocks, panels and chunks, inputs up to the 270M's
# 2,048.
SHAPES = [(1, 7, 32), (1, 1000, 640), (2, 97, 640), (3, 50, 96), (5, 4099, 640), (8, 300, 256),
          (9, 97, 640), (12, 301, 640), (13, 5000, 64), (16, 301, 640), (20, 97, 640),
          (24, 301, 640), (7, 97, 2048)]
# The same for Q4_K's blocks (a scale and an offset per 32) and Q6_K's (a scale per 16), with
# the 270M's o and down shapes.
K_SHAPES = [(1, 640, 1024), (2, 97, 256), (5, 640, 2048), (9, 301, 512), (13, 50, 256),
            (20, 97, 256), (9, 101, 2048)]
CASES = ([(shape, 'Q8_0' if shape[0] % 2 else 'Q5_0') for shape in SHAPES]
         + [(shape, kind) for kind in ('Q4_K', 'Q6_K') for shape in K_SHAPES])


def _product(x_NxI, form):
  return np.asarray(jax.jit(q8_matmul.q8_matmul)(x_NxI, *[a for a in form if a is not None]))


@pytest.mark.parametrize('shape,kind', CASES)
def test_equals_the_float32_kernel_on_the_dequantized_matrix_bit_for_bit(shape, kind):
  rows, out, inner = shape
  rng = np.random.default_rng(rows * out + inner)
  w_OxI = gguf_exact(rng.normal(size=(out, inner)), kind)
  form = q8_weights.split(w_OxI)
  assert (form.offset is not None) == (kind == 'Q4_K')
  assert form.scale.shape == (out, inner // (16 if kind == 'Q6_K' else 32))
  x_NxI = rng.normal(size=(rows, inner)).astype(np.float32)
  got = _product(x_NxI, form)
  assert got.shape == (rows, out) and got.dtype == np.float32
  assert np.array_equal(got, np.asarray(jax.jit(skinny_matmul.skinny_matmul)(x_NxI, w_OxI)))
  expected = x_NxI.astype(np.float64) @ w_OxI.astype(np.float64).T
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(inner))
  for n in range(rows):  # whatever the number of rows, block or thread
    alone = _product(x_NxI[n:n + 1], form)[0]
    assert np.array_equal(got[n], alone), f'row {n} of {rows} differs from itself alone'


def test_a_bad_operand_is_named():
  with pytest.raises(ValueError, match='B in'):
    q8_matmul.q8_matmul(jnp.ones((2, 40)), jnp.ones((5, 40), jnp.int8), jnp.ones((5, 1)))
  with pytest.raises(ValueError, match=r'int8 q\[O, I\]'):
    q8_matmul.q8_matmul(jnp.ones((2, 64)), jnp.ones((5, 64)), jnp.ones((5, 2)))
  with pytest.raises(ValueError, match='offset like scale'):
    q8_matmul.q8_matmul(jnp.ones((2, 64)), jnp.ones((5, 64), jnp.int8), jnp.ones((5, 2)),
                        jnp.ones((5, 4)))


@pytest.mark.parametrize('kind', ['Q8_0', 'Q5_0', 'Q4_0', 'Q4_K', 'Q6_K'])
def test_int8_block_formats_split_back_exactly(kind):
  rng = np.random.default_rng(1)
  matrix = gguf_exact(rng.normal(size=(300, 256)), kind)
  matrix[7, :32] = 0.0  # all-zero blocks: scale 0 (or offset 0)
  form = q8_weights.split(matrix)
  rebuilt = q8_matmul.dequantize(*[a for a in form if a is not None])
  assert np.array_equal(np.asarray(rebuilt), matrix)
  assert not form.q[7, :32].any() and not form.scale[7, :32 * form.scale.shape[1] // 256].any()
  if kind == 'Q4_K':
    assert not form.offset[7, 0]


@pytest.mark.parametrize('kind', ['Q8_0', 'Q4_K', 'Q6_K'])
def test_anything_else_does_not_split(kind):
  rng = np.random.default_rng(2)
  assert q8_weights.split(rng.normal(size=(300, 64)).astype(np.float32)) is None
  matrix = gguf_exact(rng.normal(size=(300, 256)), kind)
  off = matrix.copy()
  off[299, 63] = np.nextafter(off[299, 63], np.float32(np.inf))  # one weight one ulp away
  assert q8_weights.split(off) is None
  assert q8_weights.split(matrix[:, :40]) is None  # rows that are not whole blocks
  assert q8_weights.split(np.where(matrix == matrix[0, 0], np.nan, matrix)) is None
  assert q8_weights.split(matrix.astype(np.float16)) is None


def test_device_arrays_split_on_the_host_without_compiling(monkeypatch):
  """`all_forms` splits matrices on a thread each: a device array sliced there is a jitted op
  that two threads, meeting one shape first at once, each compiled (a program written twice
  to the persistent cache, which CI saw as a cache hit in a process's first run)."""
  rng = np.random.default_rng(3)
  host = {f'layer_{i}': {'attn': {'q_NHxD': gguf_exact(rng.normal(size=(72, 96)))}}
          for i in range(6)}
  device = jax.tree.map(jnp.asarray, host)
  q8_amx.available(), q8_argmax.available()  # their one-time probes run a kernel: not this
  compiles = []
  listening = [True]
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, *_, **__: listening[0] and name.endswith('compile_duration')
      and compiles.append(name))
  try:
    forms = q8_weights.all_forms(device)
    form = q8_weights.split(device['layer_0']['attn']['q_NHxD'])
  finally:
    listening[0] = False
  assert not compiles, compiles
  expected = q8_weights.all_forms(host)
  assert sorted(forms) == sorted(expected) and len(forms) >= 12
  for key, part in expected.items():
    assert np.array_equal(forms[key], part), key
  assert np.array_equal(form.q, expected['layer_0.attn.q_NHxD_q8'])


def _gguf_like_tiny(seed=0, **overrides):
  cfg = config_lib.tiny_config(**overrides)
  params = jax.tree.map(lambda x: x * 1.5, gemma.init_params(cfg, jax.random.key(seed)))
  params = gguf_like_params(params)
  return cfg, params, q8_weights.with_q8_weights(params)


def test_the_int8_forms_are_added_beside_the_matrices_that_split():
  cfg, params, with_q8 = _gguf_like_tiny()
  tiles = ([q8_weights.HEAD_L1MAX, q8_weights.HEAD_TILES, q8_weights.HEAD_TILE_SCALE]
           if q8_argmax.available() else [])   # greedy's argmax without logits (test_q8_argmax)
  assert sorted(set(with_q8) - set(params)) == sorted(
      ['embedding_VxD_q8', 'embedding_VxD_q8scale'] + tiles)
  # Where Intel AMX serves (test_q8_amx), each layer matrix's tile layout for q8_amx too.
  amx = ('_q8amxtiles', '_q8amxscale') if q8_amx.available() else ()
  assert sorted(with_q8['layer_0']['attn']) == sorted(
      list(params['layer_0']['attn']) + ['o_DxNH_q8offset']
      + (['o_DxNH_q8amxoffset'] if amx else [])
      + [f'{m}{s}' for m in ('q_NHxD', 'k_KHxD', 'v_KHxD', 'o_DxNH')
         for s in ('_q8', '_q8scale') + amx])
  mlp = with_q8['layer_3']['mlp']
  assert sorted(set(mlp) - set(params['layer_3']['mlp'])) == sorted(
      f'{m}{s}' for m in ('down_DxF', 'gate_FxD', 'up_FxD') for s in ('_q8', '_q8scale') + amx)
  assert mlp['down_DxF_q8scale'].shape == (cfg.embed_dim, cfg.hidden_dim // 16)  # Q6_K's 16
  head_only = q8_weights.with_q8_weights(params, ('embedding_VxD',))
  assert head_only['layer_0'] == params['layer_0'] and q8_weights.HEAD_FORM in head_only
  plain = gemma.init_params(cfg, jax.random.key(0))  # random float32: nothing splits
  assert q8_weights.with_q8_weights(plain) is plain
  specs = sharding.param_specs(with_q8, cfg, 2)
  assert specs['layer_0']['attn']['q_NHxD_q8scale'] == specs['layer_0']['attn']['q_NHxD']
  assert specs['layer_0']['attn']['o_DxNH_q8offset'] == specs['layer_0']['attn']['o_DxNH']
  # o's rows are 2 blocks of 32: not whole blocks on 4 shards, so it is left float32 there,
  # and a form that does not divide is named, not sent to the devices.
  four = q8_weights.with_q8_weights(params, model_shards=4)
  assert 'o_DxNH_q8' not in four['layer_0']['attn'] and 'down_DxF_q8' in four['layer_0']['mlp']
  with pytest.raises(ValueError, match=r"o_DxNH_q8(scale|offset).*2 blocks a row.*model axis size 4"):
    sharding.param_specs(with_q8, cfg, 4)


def _flat(tree, prefix=''):
  out = {}
  for key, value in tree.items():
    out.update(_flat(value, f'{prefix}{key}.') if isinstance(value, dict)
               else {prefix + key: value})
  return out


@pytest.mark.parametrize('model_shards', [1, 4])
def test_stored_forms_give_the_params_a_fresh_split_gives(model_shards, monkeypatch):
  cfg, params, _ = _gguf_like_tiny()
  forms = q8_weights.all_forms(params)
  assert {k for k in forms if k.endswith('_q8offset')} == {
      f'layer_{i}.attn.o_DxNH_q8offset' for i in range(cfg.num_layers)}
  fresh = _flat(q8_weights.with_q8_weights(params, model_shards=model_shards))
  monkeypatch.setattr(q8_weights, 'split', lambda *a: pytest.fail('split again'))
  stored = _flat(q8_weights.with_q8_weights(params, model_shards=model_shards, forms=forms))
  assert sorted(stored) == sorted(fresh)
  for key in fresh:
    assert np.array_equal(stored[key], fresh[key]), key
  head_only = q8_weights.with_q8_weights(params, ('embedding_VxD',), forms=forms)
  assert head_only['layer_0'] == params['layer_0'] and q8_weights.HEAD_FORM in head_only


def test_forms_of_another_checkpoint_are_refused():
  _, params, _ = _gguf_like_tiny()
  _, other, _ = _gguf_like_tiny(embed_dim=64, hidden_dim=128)
  with pytest.raises(ValueError, match=r"stored int8 form '\S+' \(shape .*another checkpoint"):
    q8_weights.with_q8_weights(params, forms=q8_weights.all_forms(other))
  forms = q8_weights.all_forms(params)
  with pytest.raises(ValueError, match="'layer_99.attn.q_NHxD_q8'.*belongs to no matrix"):
    q8_weights.with_q8_weights(params, forms={**forms, 'layer_99.attn.q_NHxD_q8': forms[
        'layer_0.attn.q_NHxD_q8']})


@pytest.mark.parametrize('length', [1, 2, 5, 9, 16, 24, 25])
def test_the_model_gives_the_same_logits_and_cache_from_the_int8_forms(length):
  # 2 to 15 rows: the float32 path is the skinny kernel, so everything is the same bits;
  # at 1 row it is XLA's GEMV and from 16 XLA's product (the q8 kernel takes 1 to 24).
  cfg, params, with_q8 = _gguf_like_tiny()
  with_q8 = q8_weights.without_amx(with_q8)   # q8_matmul's own sums (test_q8_amx: the other)
  model = LanguageModel(cfg)
  tokens = jnp.arange(3, 3 + length)[None] % cfg.vocab_size
  positions = jnp.arange(length)[None]
  run = jax.jit(lambda p: model.forward(p, tokens, positions, model.init_cache(1, 32)))
  plain, quant = run(params), run(with_q8)
  program = run.lower(with_q8).as_text()
  calls = [program.count(f'@{t}(') for t in (q8_matmul.TARGET, q8_matmul.OFFSET_TARGET)]
  # the head and 6 matrices in each of 4 layers, and o's Q4_K-like blocks in each layer, or
  # none past MAX_ROWS
  within = length <= q8_matmul.MAX_ROWS
  assert calls == [1 + 6 * cfg.num_layers if within else 0, cfg.num_layers if within else 0]
  if 2 <= length <= skinny_matmul.MAX_ROWS:
    assert np.array_equal(np.asarray(plain.logits_BxRxV), np.asarray(quant.logits_BxRxV))
    for a, b in zip(jax.tree.leaves(plain.cache), jax.tree.leaves(quant.cache)):
      assert np.array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_allclose(quant.logits_BxRxV, plain.logits_BxRxV, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('batch,length,width', [(1, 1, 32), (1, 5, 32), (4, 9, 32), (8, 8, 32),
                                                (13, 5, 32), (1, 1, 64), (4, 9, 64), (13, 5, 64)])
def test_a_greedy_forward_gives_the_argmax_of_its_logits(batch, length, width):
  """`greedy=True` gives each position's argmax: from the head's argmax kernel, with no
  logits, up to its row limit (64), else from the logits; the same index either way. A model
  64 wide takes the AMX screen where the CPU has AMX-INT8."""
  cfg, _, with_q8 = _gguf_like_tiny(seed=5, embed_dim=width)
  model = LanguageModel(cfg)
  rng = np.random.default_rng(batch * length)
  tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, size=(batch, length)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  run = jax.jit(lambda p, greedy: model.forward(p, tokens, positions, model.init_cache(batch, 32),
                                                greedy=greedy), static_argnums=1)
  full, greedy = run(with_q8, False), run(with_q8, True)
  assert greedy.argmax_BxR.shape == (batch, length) and greedy.argmax_BxR.dtype == jnp.int32
  assert np.array_equal(np.asarray(greedy.argmax_BxR),
                        np.asarray(jnp.argmax(full.logits_BxRxV, axis=-1)))
  served = q8_argmax.available() and batch * length <= q8_argmax.MAX_ROWS
  assert (greedy.logits_BxRxV is None) == served
  # The AMX screen where the CPU has it and the width is a multiple of 64 (not this toy's).
  target = (q8_argmax.SCREEN_TARGET if q8_argmax.screen_available() and cfg.embed_dim % 64 == 0
            else q8_argmax.TARGET)
  assert (f'@{target}(' in run.lower(with_q8, True).as_text()) == served
  for a, b in zip(jax.tree.leaves(full.cache), jax.tree.leaves(greedy.cache)):
    assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize('drafter', ['ngram', 'early_exit'])
def test_speculative_greedy_from_the_int8_forms_equals_autoregressive(drafter):
  cfg, params, with_q8 = _gguf_like_tiny(seed=3)
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


@pytest.mark.parametrize('kind', ['eagle', 'medusa'])
def test_a_trained_drafter_scores_its_head_rows_from_their_int8_form(kind):
  # The draft head is the target's table restricted to a draft vocabulary: from the table's
  # int8 form it reads a quarter of the bytes, and gives the same logits.
  cfg, params, with_q8 = _gguf_like_tiny(seed=5)
  model = LanguageModel(cfg)
  ids = np.arange(1, cfg.vocab_size, 2)
  if kind == 'eagle':
    layers = eagle_net.default_layers(cfg.num_layers)
    net = eagle_net.init_params(cfg, len(layers), 2 * cfg.embed_dim, jax.random.key(1),
                                params['final_norm']['scale'])
    made = [eagle.make(model, net, layers, vocab_ids_N=ids, target_params=p)
            for p in (params, with_q8)]
  else:
    heads = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(2), x.shape),
                         medusa.init_heads(3, cfg.embed_dim))
    made = [medusa.make(model, heads, vocab_ids_N=ids, target_params=p) for p in (params, with_q8)]
  assert made[0].params['head_q8'] is None
  q, scale = made[1].params['head_q8']
  assert np.array_equal(np.asarray(q8_matmul.dequantize(q, scale)),
                        np.asarray(with_q8['embedding_VxD'])[ids])
  # 3 rows: the float32 rows take the skinny kernel, the form the q8 kernel: the same bits.
  hidden_Bx1xD = jax.random.normal(jax.random.key(3), (3, 1, cfg.embed_dim))
  if kind == 'eagle':
    logits = [jax.jit(lambda h, f: eagle_net.logits(net, made[0].params['head_NxD'], h, cfg,
                                                    head_q8=f))(hidden_Bx1xD, f)
              for f in (None, (q, scale))]
  else:
    logits = [jax.jit(lambda h, f: medusa.head_logits(heads, made[0].params['head_NxD'], h[:, 0],
                                                      head_q8=f))(hidden_Bx1xD, f)
              for f in (None, (q, scale))]
  assert np.array_equal(np.asarray(logits[0]), np.asarray(logits[1]))
  prompts = [[5, 9, 3], [7, 1, 2, 8, 4, 6, 1, 2, 30, 31, 33], [11]]
  ar = autoregressive.generate(model, params, prompts, max_new_tokens=12)
  spec = speculative.generate(model, with_q8, made[1], prompts, gamma=3, max_new_tokens=12)
  assert spec.new_tokens == ar.new_tokens
