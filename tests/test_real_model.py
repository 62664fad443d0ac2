"""Gemma 3 270M, the embedded default target, against the Hugging Face reference.

Fixtures come from benchmarks/make_reference_fixtures.py (transformers loading
the same GGUF, float32, eager attention). The long prompt is over 600 tokens,
so the 512-token sliding window of the local layers is exercised.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling
from specjax.decoding import autoregressive, draft_length, speculative
from specjax.decoding import tree as tree_lib
from specjax.drafters import make_drafter
from specjax.models import q8_weights

from real_prompts import PROMPTS

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'gemma3_270m_logits.npz')
TOLERANCE = 1e-3  # max |delta logit|, float32


@pytest.fixture(scope='module')
def reference():
  data = np.load(FIXTURE, allow_pickle=False)
  prompts = json.loads(str(data['prompts_json']))
  return data, len(prompts)


@pytest.fixture(scope='module')
def served(gemma270m):
  """The 270M as the product serves it on CPU: every matrix also as its int8 blocks
  (models/q8_weights), which decode steps and verify calls read."""
  model, params = gemma270m
  with_forms = q8_weights.with_q8_weights(params)
  assert q8_weights.HEAD_FORM in with_forms
  assert {'o_DxNH_q8offset', 'q_NHxD_q8'} <= set(with_forms['layer_0']['attn'])
  return model, jax.device_put(with_forms)


def _full_forward(model, params, ids):
  length = len(ids)
  logits, _ = _logits_cache(jax.jit(model.forward)(params, jnp.asarray(ids)[None], jnp.arange(length)[None],
                                     model.init_cache(1, length)))
  return np.asarray(logits[0])


def test_logits_match_transformers(gemma270m, reference):
  model, params = gemma270m
  data, count = reference
  assert count == 4 and len(data['p3_ids']) > 600
  for i in range(count):
    logits = _full_forward(model, params, data[f'p{i}_ids'])
    top = np.take_along_axis(logits, data[f'p{i}_top16_ids'], axis=1)
    np.testing.assert_allclose(top, data[f'p{i}_top16_values'], atol=TOLERANCE, rtol=0)
    rows = logits[data[f'p{i}_full_positions']]
    np.testing.assert_allclose(rows, data[f'p{i}_full_logits'], atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(logits.argmax(-1), data[f'p{i}_argmax'])


@pytest.mark.parametrize('weights', ['gemma270m', 'served'])
def test_cached_decode_matches_transformers_past_the_window(weights, reference, request):
  """Prefill 500 tokens, then decode one token at a time to position 560 (from the int8
  blocks too: the decode steps' products are theirs)."""
  model, params = request.getfixturevalue(weights)
  data, _ = reference
  ids = jnp.asarray(data['p3_ids'])
  start, stop = 500, 560
  forward = jax.jit(model.forward)
  cache = model.init_cache(1, 640)
  logits, cache = _logits_cache(forward(params, ids[None, :start], jnp.arange(start)[None], cache))
  decoded = [np.asarray(logits[0, -1])]
  for t in range(start, stop):
    logits, cache = _logits_cache(forward(params, ids[None, t:t + 1], jnp.array([[t]]), cache))
    decoded.append(np.asarray(logits[0, -1]))
  decoded = np.stack(decoded[:-1])  # predictions at positions start-1 .. stop-2
  top_ids = data['p3_top16_ids'][start - 1:stop - 1]
  top = np.take_along_axis(decoded, top_ids, axis=1)
  np.testing.assert_allclose(top, data['p3_top16_values'][start - 1:stop - 1], atol=TOLERANCE,
                             rtol=0)


@pytest.mark.parametrize('weights', ['gemma270m', 'served'])
def test_speculative_greedy_equals_autoregressive_on_the_real_model(weights, request):
  model, params = request.getfixturevalue(weights)
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  for name in ('ngram', 'early_exit'):
    drafter = make_drafter(name, target=model, settings={'layers': 6} if name == 'early_exit' else None)
    out = speculative.generate(model, params, drafter, PROMPTS, gamma=4, max_new_tokens=24)
    assert out.new_tokens == reference.new_tokens, name


def test_token_tree_greedy_equals_autoregressive_on_the_real_model(gemma270m):
  """An n-gram tree (eagle-25) at batch 4 of mixed lengths, one row past the 512-token
  sliding window (batch 1 is tested on tiny models); early exit through a chain-shaped
  tree."""
  model, params = gemma270m
  long = ([2] + PROMPTS[2][1:] * 45)[:530]
  prompts = PROMPTS + [long]
  reference = autoregressive.generate(model, params, prompts, max_new_tokens=16)
  tree = tree_lib.parse('eagle-25')
  ngram = make_drafter('ngram', target=model)
  out = speculative.generate(model, params, ngram, prompts, gamma=tree.max_depth,
                             max_new_tokens=16, tree=tree)
  assert out.new_tokens == reference.new_tokens
  assert sum(out.accepted_tokens) > 0
  early = make_drafter('early_exit', target=model, settings={'layers': 6})
  chain = speculative.generate(model, params, early, PROMPTS, gamma=3, max_new_tokens=16,
                               tree=tree_lib.chain(3))
  assert chain.new_tokens == [t for t in reference.new_tokens[:3]]


def test_sampled_batch_rows_equal_rows_alone_on_the_real_model(gemma270m):
  model, params = gemma270m
  hot = sampling.SamplingConfig(temperature=0.8, top_k=50, top_p=0.95)
  drafter = make_drafter('ngram', target=model)
  # A fixed draft length: the adaptive one chooses a call's width for the whole batch,
  # so a row's draws (exact either way) depend on its neighbours there.
  fixed = draft_length.fixed(3)
  batch = speculative.generate(model, params, drafter, PROMPTS, gamma=3, max_new_tokens=16,
                               sampling=hot, seed=11, policy=fixed)
  plain = autoregressive.generate(model, params, PROMPTS, max_new_tokens=16, sampling=hot,
                                  seed=11)
  for i, prompt in enumerate(PROMPTS):
    alone = speculative.generate(model, params, drafter, [prompt], gamma=3, max_new_tokens=16,
                                 sampling=hot, seed=11, row_ids=[i], policy=fixed)
    assert alone.new_tokens[0] == batch.new_tokens[i]
  # Same first token as autoregressive sampling (same row stream), different later draws.
  assert [t[0] for t in batch.new_tokens] == [t[0] for t in plain.new_tokens]
  assert len({tuple(t) for t in batch.new_tokens}) == len(PROMPTS)


def _logits_cache(out):
  """(logits, cache) of a ForwardOutput."""
  return out.logits_BxRxV, out.cache
