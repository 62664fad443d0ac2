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

from specjax import checkpoints
from specjax import sampling
from specjax.decoding import autoregressive, draft_length, speculative
from specjax.decoding import tree as tree_lib
from specjax.drafters import make_drafter
from specjax.models import config as config_lib
from specjax.models.language_model import LanguageModel

FIXTURE = os.path.join(os.path.dirname(__file__), 'fixtures', 'gemma3_270m_logits.npz')
TOLERANCE = 1e-3  # max |delta logit|, float32


@pytest.fixture(scope='module')
def target():
  cfg, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  assert cfg == config_lib.get_model_config('gemma3-270m')
  return LanguageModel(cfg), jax.device_put(params)


@pytest.fixture(scope='module')
def reference():
  data = np.load(FIXTURE, allow_pickle=False)
  prompts = json.loads(str(data['prompts_json']))
  return data, len(prompts)


def _full_forward(model, params, ids):
  length = len(ids)
  logits, _ = _logits_cache(jax.jit(model.forward)(params, jnp.asarray(ids)[None], jnp.arange(length)[None],
                                     model.init_cache(1, length)))
  return np.asarray(logits[0])


def test_logits_match_transformers(target, reference):
  model, params = target
  data, count = reference
  assert count == 4 and len(data['p3_ids']) > 600
  for i in range(count):
    logits = _full_forward(model, params, data[f'p{i}_ids'])
    top = np.take_along_axis(logits, data[f'p{i}_top16_ids'], axis=1)
    np.testing.assert_allclose(top, data[f'p{i}_top16_values'], atol=TOLERANCE, rtol=0)
    rows = logits[data[f'p{i}_full_positions']]
    np.testing.assert_allclose(rows, data[f'p{i}_full_logits'], atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(logits.argmax(-1), data[f'p{i}_argmax'])


def test_cached_decode_matches_transformers_past_the_window(target, reference):
  """Prefill 500 tokens, then decode one token at a time to position 560."""
  model, params = target
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


PROMPTS = [
    [2, 105, 2364, 107, 6974, 786, 496, 3925, 1003, 506, 5442, 236761, 106, 107, 105, 4368, 107],
    [2, 818, 5279, 529, 7001, 563],
    [2, 2364, 563, 496, 1500, 529, 4088, 236764, 2364, 563, 496, 1500, 529],
]


def test_speculative_greedy_equals_autoregressive_on_the_real_model(target):
  model, params = target
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  for name in ('ngram', 'early_exit'):
    drafter = make_drafter(name, target=model, settings={'layers': 6} if name == 'early_exit' else None)
    out = speculative.generate(model, params, drafter, PROMPTS, gamma=4, max_new_tokens=24)
    assert out.new_tokens == reference.new_tokens, name


def test_token_tree_greedy_equals_autoregressive_on_the_real_model(target):
  """An n-gram tree (eagle-25) at batch 4 of mixed lengths, one row past the 512-token
  sliding window (batch 1 is tested on tiny models); early exit through a chain-shaped
  tree."""
  model, params = target
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


def test_sampled_batch_rows_equal_rows_alone_on_the_real_model(target):
  model, params = target
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


def test_the_shipped_eagle_drafter_is_exact_and_beats_an_untrained_one(target):
  """The EAGLE drafter shipped for the embedded 270M (eagle.checkpoint='embedded'): tied to
  this target, greedy output identical to autoregressive at batch 3 of mixed lengths, and
  more drafts accepted than by an untrained layer of the same shape, on prompts that are
  not its training data (the target's own text from BOS)."""
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  from specjax.drafters import eagle_net  # pylint: disable=g-import-not-at-top
  model, params = target
  signature = drafter_io.target_signature(model.config,
                                          checkpoints.content_digest('embedded:gemma3-270m'))
  net, ids, manifest = drafter_io.load_drafter('embedded', 'eagle', target=signature)
  untrained = eagle_net.init_params(model.config, len(manifest['hidden_layers']),
                                    net['gate_FxD'].shape[0], jax.random.key(0),
                                    params['final_norm']['scale'])
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  accepted = {}
  for name, weights in (('trained', net), ('untrained', untrained)):
    drafter = make_drafter('eagle', target=model, trained=(weights, ids, manifest),
                           target_params=params)
    out = speculative.generate(model, params, drafter, PROMPTS, gamma=4, max_new_tokens=24,
                               policy=draft_length.fixed(4))
    assert out.new_tokens == reference.new_tokens, name
    accepted[name] = sum(out.accepted_tokens)
  assert accepted['trained'] >= accepted['untrained'] + 6, accepted


def test_the_shipped_distilled_drafter_is_exact_and_beats_the_target_cut_short(target):
  """The distilled draft model shipped for the embedded 270M (draft_model.checkpoint=
  'embedded'): tied to this target, greedy output identical to autoregressive at batch 3
  of mixed lengths, and more drafts accepted than by its untrained start (the target's
  first blocks and final norm, through the same draft vocabulary), on prompts that are
  not its training data; exact as a branching tree too."""
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  from specjax.training import distilled_objective  # pylint: disable=g-import-not-at-top
  model, params = target
  signature = drafter_io.target_signature(model.config,
                                          checkpoints.content_digest('embedded:gemma3-270m'))
  weights, ids, manifest = drafter_io.load_drafter('embedded', 'distilled', target=signature)
  layers = manifest['student_layers']
  student = LanguageModel(distilled_objective.student_config(model.config, layers))
  untrained = distilled_objective.student_init(params, layers)
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  accepted, drafters = {}, {}
  for name, student_weights in (('trained', jax.tree.map(jnp.asarray, weights)),
                                ('untrained', untrained)):
    student_params = distilled_objective.student_params(student_weights, params['embedding_VxD'])
    drafters[name] = make_drafter('draft_model', target=model,
                                  draft_model=(student, student_params, jnp.asarray(ids)))
    out = speculative.generate(model, params, drafters[name], PROMPTS, gamma=4, max_new_tokens=24,
                               policy=draft_length.fixed(4))
    assert out.new_tokens == reference.new_tokens, name
    accepted[name] = sum(out.accepted_tokens)
  assert accepted['trained'] >= accepted['untrained'] + 6, accepted
  tree = tree_lib.parse('-1,-1,0,0,2,4')   # the trained one, as a branching tree
  out = speculative.generate(model, params, drafters['trained'], PROMPTS, gamma=tree.max_depth,
                             max_new_tokens=24, tree=tree)
  assert out.new_tokens == reference.new_tokens


def test_the_shipped_medusa_heads_are_exact_and_beat_untrained_ones(target):
  """The Medusa heads shipped for the embedded 270M (medusa.checkpoint='embedded'): tied to
  this target, greedy output identical to autoregressive at batch 3 of mixed lengths, as a
  chain and as a tree, and more drafts accepted than by untrained heads of the same
  shape (residual blocks at zero: every head guesses the target's own next token)."""
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  from specjax.drafters import medusa  # pylint: disable=g-import-not-at-top
  model, params = target
  signature = drafter_io.target_signature(model.config,
                                          checkpoints.content_digest('embedded:gemma3-270m'))
  heads, ids, manifest = drafter_io.load_drafter('embedded', 'medusa', target=signature)
  untrained = medusa.init_heads(len(heads['w_KxDxD']), model.config.embed_dim)
  reference = autoregressive.generate(model, params, PROMPTS, max_new_tokens=24)
  accepted, drafters = {}, {}
  for name, weights in (('trained', jax.tree.map(jnp.asarray, heads)), ('untrained', untrained)):
    drafters[name] = make_drafter('medusa', target=model, trained=(weights, ids, manifest),
                                  target_params=params)
    out = speculative.generate(model, params, drafters[name], PROMPTS, gamma=4,
                               max_new_tokens=24, policy=draft_length.fixed(4))
    assert out.new_tokens == reference.new_tokens, name
    accepted[name] = sum(out.accepted_tokens)
  assert accepted['trained'] >= accepted['untrained'] + 6, accepted
  tree = tree_lib.parse('-1,-1,0,0,2,4')   # 4 deep: a level per head
  out = speculative.generate(model, params, drafters['trained'], PROMPTS, gamma=tree.max_depth,
                             max_new_tokens=24, tree=tree)
  assert out.new_tokens == reference.new_tokens
