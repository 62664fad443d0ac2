"""The Gemma forward: cached decoding equals a full pass, sizes match the
published ones, and autoregressive decoding treats every row on its own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling
from specjax.cpu_kernels import attention as attention_lib
from specjax.decoding import autoregressive
from specjax.models import config as config_lib
from specjax.models import gemma
from specjax.models.language_model import LanguageModel

# Published parameter counts (Hugging Face model cards / safetensors headers;
# Gemma 3 4B, 12B and 27B: text tower only, the 262,144-token vocabulary).
PUBLISHED_SIZES = {
    'gemma3-270m': 268_098_176,
    'gemma3-1b': 999_885_952,
    'gemma3-4b': 3_880_099_328,
    'gemma3-12b': 11_765_788_416,
    'gemma3-27b': 27_009_002_240,
    'gemma2-2b': 2_614_341_888,
    'gemma2-9b': 9_241_705_984,
    'gemma2-27b': 27_227_128_320,
}


@pytest.mark.parametrize('name', sorted(PUBLISHED_SIZES))
def test_parameter_count_matches_published_size(name):
  shapes = gemma.param_shapes(config_lib.get_model_config(name))
  assert gemma.count_params(shapes) == PUBLISHED_SIZES[name]


def test_every_config_has_a_published_size():
  assert set(config_lib.MODEL_CONFIGS) == set(PUBLISHED_SIZES)


def test_gemma3_270m_layer_kinds():
  cfg = config_lib.get_model_config('gemma3-270m')
  assert [i for i, k in enumerate(cfg.attention_kinds) if k == 'global'] == [5, 11, 17]
  assert config_lib.get_model_config('gemma2-2b').attention_kinds[:4] == (
      'local', 'global', 'local', 'global')


def test_unknown_model_name_is_refused():
  with pytest.raises(ValueError, match="unknown model 'gemma9-1t'"):
    config_lib.get_model_config('gemma9-1t')


def _tiny(**overrides):
  cfg = config_lib.tiny_config(**overrides)
  params = jax.tree.map(lambda x: x * 1.5, gemma.init_params(cfg, jax.random.key(0)))
  return cfg, params, LanguageModel(cfg)


@pytest.mark.parametrize('family', ['gemma3', 'gemma2'])
@pytest.mark.parametrize('slots', [21, 32])
@pytest.mark.parametrize('attention_kernel', [True, False])
def test_cached_decode_equals_full_forward_across_the_window(family, slots, attention_kernel,
                                                              monkeypatch):
  """With 21 slots the full forward (20 tokens, a window of 25 slots) reads the whole
  cache and each decode step its 6-slot window; with 32 both read windows, the
  slice starting at the first slot. With the CPU attention kernel a decode step
  takes the whole cache and the mask instead of a slice; without it, XLA's
  einsums read the slice."""
  if not attention_kernel:
    monkeypatch.setattr(attention_lib, 'applies', lambda *args: False)
  elif jax.default_backend() == 'cpu':
    assert attention_lib.available()
  extra = dict(attn_logit_softcap=50.0, final_logit_softcap=30.0, use_qk_norm=False,
               global_every=2) if family == 'gemma2' else {}
  cfg, params, model = _tiny(family=family, **extra)
  length, batch = 3 * cfg.sliding_window + 2, 2
  assert gemma.window_slots(21, cfg.sliding_window, length) is None
  assert gemma.window_slots(21, cfg.sliding_window, 1) == cfg.sliding_window
  tokens = jax.random.randint(jax.random.key(1), (batch, length), 0, cfg.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  full, _ = _logits_cache(model.forward(params, tokens, positions, model.init_cache(batch, slots)))

  cache = model.init_cache(batch, slots)
  logits, cache = _logits_cache(model.forward(params, tokens[:, :4], positions[:, :4], cache))
  steps = [logits]
  for t in range(4, length):
    logits, cache = _logits_cache(model.forward(params, tokens[:, t:t + 1], positions[:, t:t + 1], cache))
    steps.append(logits)
  incremental = jnp.concatenate(steps, axis=1)
  # Decoding reads a window slice, or the kernel sums in its own order.
  np.testing.assert_allclose(incremental, full, atol=1e-4, rtol=1e-5)
  assert float(jnp.abs(full).max()) > 1.0


def test_sliding_window_changes_the_result():
  """A control for the test above: local layers really do see less context."""
  cfg, params, model = _tiny()
  wide = LanguageModel(config_lib.tiny_config(sliding_window=1000))
  length = 3 * cfg.sliding_window
  tokens = jax.random.randint(jax.random.key(1), (1, length), 0, cfg.vocab_size)
  positions = jnp.arange(length)[None]
  narrow_logits, _ = _logits_cache(model.forward(params, tokens, positions, model.init_cache(1, length)))
  wide_logits, _ = _logits_cache(wide.forward(params, tokens, positions, wide.init_cache(1, length)))
  early = cfg.sliding_window
  np.testing.assert_allclose(narrow_logits[:, :early], wide_logits[:, :early], atol=1e-5)
  assert float(jnp.abs(narrow_logits[:, -1] - wide_logits[:, -1]).max()) > 1e-3


def test_logit_indices_pick_positions():
  cfg, params, model = _tiny()
  tokens = jnp.arange(10)[None] % cfg.vocab_size
  positions = jnp.arange(10)[None]
  full, _ = _logits_cache(model.forward(params, tokens, positions, model.init_cache(1, 16)))
  picked, _ = _logits_cache(model.forward(params, tokens, positions, model.init_cache(1, 16),
                            jnp.array([[7, 2]])))
  np.testing.assert_allclose(picked[0], full[0, jnp.array([7, 2])], atol=1e-6)


@pytest.mark.parametrize('batch,rows', [(1, 1), (1, 2), (1, 5), (2, 8), (1, 17), (4, 5), (8, 8),
                                        (5, 13), (1, 15)])
def test_head_logits_equal_the_matmul_whichever_form_it_takes(batch, rows):
  # On CPU: 2 to 15 rows take the skinny-matmul kernel, 1 XLA's GEMV, 16 to 64 the
  # multiply-and-reduce, more than 64 XLA's matmul.
  rng = np.random.default_rng(batch * 100 + rows)
  table_VxD = rng.normal(size=(3000, 48)).astype(np.float32)
  x_BxRxD = rng.normal(size=(batch, rows, 48)).astype(np.float32)
  expected = np.einsum('brd,vd->brv', x_BxRxD.astype(np.float64), table_VxD.astype(np.float64))
  got = np.asarray(jax.jit(gemma.head_logits)(jnp.asarray(x_BxRxD), jnp.asarray(table_VxD)))
  assert got.shape == (batch, rows, 3000) and got.dtype == np.float32
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
  assert np.array_equal(got.argmax(-1), expected.argmax(-1))


PROMPTS = [[5, 9, 3], [7, 1, 2, 8, 4, 6, 1, 2, 30, 31, 33], [11], [3, 3, 5, 2, 9]]


@pytest.mark.parametrize('settings', [
    sampling.SamplingConfig(),
    sampling.SamplingConfig(temperature=1.0),
    sampling.SamplingConfig(temperature=0.7, top_k=10, top_p=0.9),
])
def test_batch_of_mixed_lengths_gives_each_row_what_it_gives_alone(settings):
  _, params, model = _tiny()
  batch = autoregressive.generate(model, params, PROMPTS, max_new_tokens=12, sampling=settings,
                                  seed=7)
  for i, prompt in enumerate(PROMPTS):
    alone = autoregressive.generate(model, params, [prompt], max_new_tokens=12,
                                    sampling=settings, seed=7, row_ids=[i])
    assert alone.new_tokens[0] == batch.new_tokens[i]
  assert all(len(t) == 12 for t in batch.new_tokens)


def test_seeded_sampling_is_deterministic_and_seed_dependent():
  _, params, model = _tiny()
  hot = sampling.SamplingConfig(temperature=1.0)
  a = autoregressive.generate(model, params, PROMPTS, max_new_tokens=16, sampling=hot, seed=1)
  b = autoregressive.generate(model, params, PROMPTS, max_new_tokens=16, sampling=hot, seed=1)
  c = autoregressive.generate(model, params, PROMPTS, max_new_tokens=16, sampling=hot, seed=2)
  assert a.new_tokens == b.new_tokens
  assert a.new_tokens != c.new_tokens


def test_eos_stops_each_row():
  _, params, model = _tiny()
  free = autoregressive.generate(model, params, PROMPTS, max_new_tokens=12)
  eos = free.new_tokens[1][4]
  stopped = autoregressive.generate(model, params, PROMPTS, max_new_tokens=12, eos_ids=[eos])
  for row, tokens in zip(free.new_tokens, stopped.new_tokens):
    cut = row.index(eos) + 1 if eos in row else len(row)
    assert tokens == row[:cut]


def test_greedy_equals_argmax_of_a_full_forward():
  _, params, model = _tiny()
  prompt = PROMPTS[1]
  out = autoregressive.generate(model, params, [prompt], max_new_tokens=8).new_tokens[0]
  # One full (uncached) forward over a fixed length, compiled once: under causal
  # attention the padding after position t does not change the logits at t.
  total = len(prompt) + 8
  forward = jax.jit(lambda ids: _logits_cache(model.forward(
      params, ids, jnp.arange(total)[None], model.init_cache(1, 32)))[0])
  seq = list(prompt)
  for _ in range(8):
    logits = forward(jnp.array([seq + [0] * (total - len(seq))]))
    seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
  assert seq[len(prompt):] == out


@pytest.mark.parametrize('bad, message', [
    (dict(prompts=[[]]), 'prompt 0 is empty'),
    (dict(prompts=[[1] * 60]), 'needs 71 cache slots, more than the 64 allowed'),
    (dict(prompts=[[1, 999]]), 'token ids outside'),
    (dict(max_new_tokens=0), 'max_new_tokens must be >= 1'),
])
def test_bad_generation_input_is_refused(bad, message):
  _, params, model = _tiny()
  args = dict(prompts=[[1, 2]], max_new_tokens=10) | bad
  with pytest.raises(ValueError, match=message):
    autoregressive.generate(model, params, args['prompts'], max_new_tokens=args['max_new_tokens'],
                            max_cache_len=64)


@pytest.mark.parametrize('kwargs, message', [
    (dict(temperature=-0.5), 'temperature must be >= 0'),
    (dict(top_p=0.0), r'top_p must be in \(0, 1\]'),
    (dict(top_p=1.5), r'top_p must be in \(0, 1\]'),
    (dict(top_k=-1), 'top_k must be >= 0'),
])
def test_invalid_sampling_values_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    sampling.SamplingConfig(**kwargs)


def test_top_k_and_top_p_filter_the_distribution():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  top2 = sampling.probabilities(logits, sampling.SamplingConfig(temperature=1.0, top_k=2))
  np.testing.assert_allclose(top2[0], [0.625, 0.375, 0, 0], atol=1e-6)
  nucleus = sampling.probabilities(logits, sampling.SamplingConfig(temperature=1.0, top_p=0.85))
  np.testing.assert_allclose(nucleus[0], [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0], atol=1e-6)
  greedy = sampling.probabilities(logits, sampling.SamplingConfig())
  np.testing.assert_allclose(greedy[0], [1, 0, 0, 0])


def _sorted_nucleus(logits, top_p):
  """Top-p by a sort, as written before the bisection: the reference."""
  order = np.argsort(-logits, kind='stable')
  probs = np.exp(logits[order] - logits[order][0])
  probs /= probs.sum()
  mass_before = np.cumsum(probs) - probs
  cutoff = logits[order][mass_before < top_p].min()
  return logits >= cutoff


@pytest.mark.parametrize('top_p', [0.05, 0.5, 0.8, 0.9, 0.95, 0.999])
def test_nucleus_keeps_what_the_sorted_rule_keeps(top_p):
  """Bisection over float bit patterns against the sort, on random logits with
  ties (rounded logits, +0.0 beside -0.0), masked tokens (-inf) and wide ranges."""
  rng = np.random.default_rng(int(top_p * 1000))
  for trial in range(40):
    vocab = int(rng.choice([2, 5, 17, 60]))   # few shapes: each one compiles
    logits = (rng.normal(size=(4, vocab)) * rng.uniform(0.1, 10)).astype(np.float32)
    if trial % 2:
      logits = np.round(logits)
      logits[:, ::3] *= -1.0   # -0.0 where a logit rounded to 0
    if trial % 5 == 0:
      logits[:, :vocab // 3] = -np.inf
    got = np.asarray(sampling.nucleus(jnp.asarray(logits), top_p))
    want = np.stack([_sorted_nucleus(row, top_p) for row in logits])
    np.testing.assert_array_equal(got, want, err_msg=f'trial {trial}: {logits}')


def _logits_cache(out):
  """(logits, cache) of a ForwardOutput."""
  return out.logits_BxRxV, out.cache
