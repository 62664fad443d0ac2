"""Self-drafters (early exit, layer skipping) with and without a reduced draft vocabulary.

Greedy parity with plain decoding at batch 4 (mixed lengths) and each row alone,
on the tiny random Gemma of test_speculative; the reduced head's sampling rule
by chi-square on the toy bigram target of test_acceptance, with negative
controls; bad inputs (a vocabulary of another tokenizer, layers the model
lacks) as errors naming the config key, raised before anything is compiled.
"""

from __future__ import annotations

import tempfile

import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.drafters import draft_vocab
from specjax.drafters import layer_skip
from specjax.drafters import make_drafter
from specjax.experiments import config as config_lib
from specjax.experiments import preflight
from specjax.models import config as model_configs

import test_acceptance as acc
from test_config import get_config
from test_speculative import (MAX_NEW, PADDED, PROMPTS, TARGET, TARGET_PARAMS,
                              check_metric_invariants, eos_id, greedy_reference, spec_generate)

SamplingConfig = sampling_lib.SamplingConfig

# 40 of tiny_gemma's 64 tokens, in a random order: some of its greedy tokens are outside.
_VOCAB_DIR = tempfile.mkdtemp(prefix='specjax-draft-vocab-')
VOCAB_PATH = f'{_VOCAB_DIR}/tiny.npz'
draft_vocab.save(draft_vocab.DraftVocab(
    np.random.default_rng(0).permutation(64)[:40].astype(np.int32), 64, 'tiny-test'), VOCAB_PATH)

SELF_DRAFTERS = {
    'early_exit': ('early_exit', dict(layers=2)),
    'early_exit_reduced': ('early_exit', dict(layers=2, draft_vocab=VOCAB_PATH)),
    'layer_skip': ('layer_skip', dict(skip=(1, 2), draft_vocab='')),
    'layer_skip_reduced': ('layer_skip', dict(skip=(1,), draft_vocab=VOCAB_PATH,
                                              draft_vocab_size=32)),
}


def self_drafter(key):
  name, settings = SELF_DRAFTERS[key]
  return make_drafter(name, target=TARGET, settings=settings, target_params=TARGET_PARAMS)


_DRAFTERS = {}


def drafter(key):
  """One object per key, so each compiled program is reused across tests."""
  if key not in _DRAFTERS:
    _DRAFTERS[key] = self_drafter(key)
  return _DRAFTERS[key]


# ------------------------------------------------------------- greedy parity


@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
@pytest.mark.parametrize('key', list(SELF_DRAFTERS))
def test_greedy_self_speculation_equals_greedy_autoregressive(key, adaptive):
  eos, gamma = (eos_id(),), 3
  out = spec_generate(PADDED, TARGET_PARAMS, drafter(key), PROMPTS, gamma=gamma,
                      max_new_tokens=MAX_NEW, eos_ids=eos, adaptive=adaptive)
  assert out.new_tokens == greedy_reference()
  check_metric_invariants(out, gamma, adaptive)
  if not adaptive:
    accepted, drafted = sum(out.accepted_tokens), sum(out.drafted_tokens)
    assert 0 < accepted < drafted, (key, accepted, drafted)   # both happen: the test has teeth
  for i, prompt in enumerate(PROMPTS):   # batch 1 (padded to 4 rows)
    alone = spec_generate(PADDED, TARGET_PARAMS, drafter(key), [prompt], gamma=gamma,
                          max_new_tokens=MAX_NEW, eos_ids=eos, adaptive=adaptive)
    assert alone.new_tokens == [greedy_reference()[i]], (key, i)


def test_a_reduced_head_drafts_only_its_tokens():
  """The proposal's ids are the subset's, mapped back to full ids; q is zero outside."""
  d = drafter('early_exit_reduced')
  ids = np.asarray(draft_vocab.load(VOCAB_PATH).ids_N)
  tokens = jnp.asarray([[2, 5, 9, 11, 0, 0, 0, 0]] * 4, jnp.int32)
  lengths = jnp.asarray([4, 3, 2, 1], jnp.int32)
  cache = TARGET.init_cache(4, 16)
  out = TARGET.forward(TARGET_PARAMS, tokens, jnp.broadcast_to(jnp.arange(8), (4, 8)), cache)
  for sampling in (SamplingConfig(), SamplingConfig(temperature=1.0, top_p=0.9)):
    proposal = d.propose(params=d.params, state=(), tokens_BxS=tokens, lengths_B=lengths,
                         keys_B=sampling_lib.row_keys(0, range(4)), sampling=sampling, gamma=3,
                         shared=(TARGET_PARAMS, out.cache))
    assert np.isin(np.asarray(proposal.draft_BxG), ids).all()
    if proposal.q_BxGxV is not None:
      q = np.asarray(proposal.q_BxGxV)
      outside = np.setdiff1d(np.arange(64), ids)
      assert (q[..., outside] == 0).all()
      np.testing.assert_allclose(q.sum(-1), 1.0, rtol=1e-5)
      drafted_q = np.take_along_axis(q, np.asarray(proposal.draft_BxG)[..., None], -1)
      assert (drafted_q > 0).all()


def test_skipped_layers_neither_read_nor_write_their_cache():
  tokens, positions = jnp.asarray([[3, 4]]), jnp.asarray([[0, 1]])
  cache = TARGET.init_cache(1, 4)
  out = TARGET.forward(TARGET_PARAMS, tokens, positions, cache, skip_layers=(1, 3), logits=False)
  assert out.logits_BxRxV is None
  for i in (1, 3):
    assert not np.asarray(out.cache[i]['k']).any()
  for i in (0, 2):
    assert np.asarray(out.cache[i]['k']).any()
  # Skipping nothing is the full model; skipping a layer changes the hidden state.
  full = TARGET.forward(TARGET_PARAMS, tokens, positions, cache)
  none = TARGET.forward(TARGET_PARAMS, tokens, positions, cache, skip_layers=())
  np.testing.assert_array_equal(full.logits_BxRxV, none.logits_BxRxV)
  assert not np.allclose(full.hidden_BxTxD, out.hidden_BxTxD)


# ------------------------------------------------------ the vocabulary file


def test_vocabulary_file_round_trip_prefixes_and_coverage(tmp_path):
  vocab = draft_vocab.DraftVocab(np.array([5, 1, 3, 0], np.int32), 8, 'abc', dict(command='x'))
  draft_vocab.save(vocab, tmp_path / 'v.npz')
  back = draft_vocab.load(tmp_path / 'v.npz')
  assert back.ids_N.tolist() == [5, 1, 3, 0] and back.vocab_size == 8
  assert back.tokenizer == 'abc' and back.provenance == dict(command='x')
  assert back.first(2).ids_N.tolist() == [5, 1] and back.first(0).size == 4
  assert back.coverage([5, 5, 2, 7]) == 0.5
  with pytest.raises(ValueError, match='distinct'):
    draft_vocab.DraftVocab(np.array([1, 1]), 8, 'abc')
  with pytest.raises(ValueError, match=r'in \[0, 8\)'):
    draft_vocab.DraftVocab(np.array([1, 8]), 8, 'abc')
  (tmp_path / 'junk.npz').write_text('not a zip')
  with pytest.raises(ValueError, match='junk.npz is not a readable draft vocabulary'):
    draft_vocab.load(tmp_path / 'junk.npz')


class _Pieces:
  vocab_size = 3

  def __init__(self, pieces):
    self.pieces = pieces

  def id_to_piece(self, i):
    return self.pieces[i]


def test_tokenizer_fingerprint_changes_with_any_piece():
  a = draft_vocab.tokenizer_fingerprint(_Pieces(['<pad>', 'a', 'b']))
  assert a == draft_vocab.tokenizer_fingerprint(_Pieces(['<pad>', 'a', 'b']))
  assert a != draft_vocab.tokenizer_fingerprint(_Pieces(['<pad>', 'b', 'a']))
  assert len(a) == 16


def test_the_shipped_vocabulary_belongs_to_the_embedded_tokenizer():
  from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
  from specjax.experiments import loading  # pylint: disable=g-import-not-at-top
  vocab = draft_vocab.load(draft_vocab.EMBEDDED_FILE)
  tokenizer = loading.load_tokenizer(str(embedded.default_gguf_path()))
  assert vocab.tokenizer == draft_vocab.tokenizer_fingerprint(tokenizer)
  assert vocab.vocab_size == model_configs.get_model_config('gemma3-270m').vocab_size
  assert vocab.size >= 65536 and 'command' in vocab.provenance


# ------------------------------------------------------------- bad input


def test_a_vocabulary_of_another_tokenizer_is_refused_before_compiling():
  with pytest.raises(ValueError, match=r"config.early_exit.draft_vocab is '.*tiny.npz'.*"
                                       r'another tokenizer.*tiny-test.*other-tok'):
    make_drafter('early_exit', target=TARGET, target_params=TARGET_PARAMS,
                 settings=dict(layers=2, draft_vocab=VOCAB_PATH), tokenizer='other-tok')
  with pytest.raises(ValueError, match=r"config.layer_skip.draft_vocab is 'embedded'.*"
                                       r'262144-token vocabulary; the target has 64'):
    make_drafter('layer_skip', target=TARGET, target_params=TARGET_PARAMS,
                 settings=dict(skip=(1,), draft_vocab='embedded'))
  with pytest.raises(ValueError, match=r'config.early_exit.draft_vocab.*/nope.npz is not'):
    make_drafter('early_exit', target=TARGET, target_params=TARGET_PARAMS,
                 settings=dict(layers=2, draft_vocab='/nope.npz'))
  with pytest.raises(ValueError, match=r'config.early_exit.draft_vocab_size must be >= 0'):
    make_drafter('early_exit', target=TARGET, settings=dict(draft_vocab_size=-1))


@pytest.mark.parametrize('skip,match', [
    ((4,), r'config.layer_skip.skip names layer\(s\) \[4\] the target lacks: it has 4 layers'),
    ((-1, 2), r'config.layer_skip.skip names layer\(s\) \[-1\]'),
    ((0, 1, 2, 3), r'config.layer_skip.skip leaves out all 4 layers'),
    ((1, 1), r'config.layer_skip.skip names a layer twice'),
    (('a',), r'config.layer_skip.skip must be layer numbers'),
    ((), r'config.layer_skip.skip is empty, and the shipped search result .* another model'),
])
def test_a_skip_set_the_model_lacks_is_refused_before_compiling(skip, match):
  with pytest.raises(ValueError, match=match):
    make_drafter('layer_skip', target=TARGET, settings=dict(skip=skip, draft_vocab=''))


def _config(tmp_path, **values):
  config = get_config().to_dict()
  config.update(output_dir=str(tmp_path / 'out'), **values)
  return config_lib.ExperimentConfig.from_config(config)


def test_preflight_names_the_key_before_any_weight_loads(tmp_path):
  """The embedded model has 18 layers; a foreign vocabulary file fails on the fingerprint."""
  cfg = _config(tmp_path, drafters=('layer_skip',), layer_skip=dict(skip=(3, 18)))
  with pytest.raises(config_lib.ConfigError,
                     match=r'config.layer_skip.skip names layer\(s\) \[18\] .* 18 layers'):
    preflight.check_config(cfg)
  preflight.check_config(_config(tmp_path, drafters=('layer_skip',)))   # the shipped set
  cfg = _config(tmp_path, model='tiny-random', drafters=('early_exit',),
                early_exit=dict(layers=2, draft_vocab=VOCAB_PATH))
  from specjax.experiments import tiny  # pylint: disable=g-import-not-at-top
  with pytest.raises(config_lib.ConfigError,
                     match=r'config.early_exit.draft_vocab is .*another tokenizer'):
    preflight.check_draft_vocab(cfg, tiny.ByteTokenizer())


def test_layer_skip_settings_come_from_the_nested_config_entry():
  config = get_config('layer_skip.skip=2+5,early_exit.draft_vocab=embedded')
  assert tuple(config.layer_skip.skip) == (2, 5)
  settings = config_lib.ExperimentConfig.from_config(
      dict(config.to_dict(), output_dir='x')).drafter_settings('layer_skip')
  assert settings.skip == (2, 5) and settings.draft_vocab == 'embedded'
  found = layer_skip.searched()
  assert 'skip' in found and 'command' in found and found['model']['num_layers'] == 18


# ------------------------------------------------ sampling: exact with a reduced head

SUBSET = np.array([4, 0, 2, 5], np.int32)   # the toy's draft vocabulary: 4 of its 6 tokens


def reduced_table_drafter(*, q_from_full_head=False) -> base.Drafter:
  """Samples from the toy draft table restricted to SUBSET with `draft_vocab.draw`, as the
  self-drafters do. `q_from_full_head=True` reports the full table's q instead: the bug
  a distribution test must reject (the draft never comes from outside the subset)."""

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del shared
    table_VxV = jnp.asarray(params, jnp.float32)
    ids_N = jnp.asarray(SUBSET)
    token_B = tokens_BxS[jnp.arange(tokens_BxS.shape[0]), lengths_B - 1]
    drafts, qs = [], []
    for i in range(gamma):
      logits_BxV = table_VxV[token_B]
      token_B, _, q_BxV = draft_vocab.draw(sampling_lib.step_keys(keys_B, i),
                                           logits_BxV[:, ids_N], ids_N, acc.V, sampling)
      if q_from_full_head:
        q_BxV = sampling_lib.probabilities(logits_BxV, sampling)
      drafts.append(token_B)
      qs.append(q_BxV)
    q_BxGxV = None if qs[0] is None else jnp.stack(qs, axis=1)
    return base.Proposal(jnp.stack(drafts, axis=1), q_BxGxV,
                         jnp.full(lengths_B.shape, gamma, jnp.int32), state)

  return base.Drafter(name='reduced_table_full_q' if q_from_full_head else 'reduced_table',
                      vocab_size=acc.V, init=base.no_state_init, update=base.no_state_update,
                      propose=propose, params=jnp.asarray(acc.DRAFT_TABLE, jnp.float32))


REDUCED = reduced_table_drafter()


@pytest.mark.parametrize('config,gamma', [('t1', 2), ('topp', 3)])
def test_reduced_vocabulary_sampling_is_exact(config, gamma):
  cfg = acc.CONFIGS[config]
  out = acc.run_speculative(REDUCED, cfg, gamma, seed=gamma)
  p_value, impossible = acc.check_exact(out.new_tokens, cfg)
  assert impossible == 0
  assert p_value > acc.P_VALUE_OK, p_value
  rate = np.sum(out.accepted_tokens) / np.sum(out.drafted_tokens)
  assert 0.03 < rate < 0.95, rate


@pytest.mark.parametrize('config', ['t1', 'topp'])
def test_distribution_test_rejects_the_full_heads_q_for_a_subset_draft(config):
  """Negative control: the draft drawn over the subset, q reported over the whole vocabulary."""
  cfg = acc.CONFIGS[config]
  out = acc.run_speculative(reduced_table_drafter(q_from_full_head=True), cfg, 2, seed=2)
  p_value, impossible = acc.check_exact(out.new_tokens, cfg)
  assert p_value < acc.P_VALUE_WRONG or impossible > 0, p_value


def test_the_subset_leaves_out_tokens_the_target_draws():
  """Guards the chi-square tests: the toy subset misses tokens the target does produce,
  so a wrong q outside the subset would show."""
  probs = np.stack([acc.np_probabilities(row, acc.CONFIGS['t1']) for row in acc.TARGET_TABLE])
  outside = np.setdiff1d(np.arange(acc.V), SUBSET)
  assert probs[:, outside].sum(1).min() > 0.05


# ------------------------------------------------------------- the real 270M


REAL_PROMPTS = [   # mixed lengths; ids of the embedded tokenizer
    [2, 818, 5279, 529, 7001, 563],
    [2, 2364, 563, 496, 1500, 529, 4088, 236764, 2364, 563, 496, 1500, 529],
    [2, 105, 2364, 107, 6974, 786, 496, 3925, 1003, 506, 5442, 236761, 106, 107, 105, 4368, 107],
    [2, 9259],
]


def test_greedy_self_speculation_with_a_reduced_head_equals_plain_on_the_270m(gemma270m):
  """early_exit (4 layers) and layer_skip (one layer skipped; the shipped set may skip
  none), each with the shipped 32k head, at batch 4 of mixed lengths and batch 1."""
  from specjax.decoding import autoregressive, draft_length, speculative  # pylint: disable=g-import-not-at-top
  model, params = gemma270m
  reference = autoregressive.generate(model, params, REAL_PROMPTS, max_new_tokens=16).new_tokens
  fixed = draft_length.fixed(4)
  drafters = {
      'early_exit': make_drafter('early_exit', target=model, target_params=params,
                                 settings=dict(layers=4, draft_vocab='embedded')),
      'layer_skip': make_drafter('layer_skip', target=model, target_params=params,
                                 settings=dict(skip=(4,))),
  }
  for name, d in drafters.items():
    out = speculative.generate(model, params, d, REAL_PROMPTS, gamma=4, max_new_tokens=16,
                               policy=fixed)
    assert out.new_tokens == reference, name
    assert 0 < sum(out.accepted_tokens) < sum(out.drafted_tokens), name
  alone = speculative.generate(model, params, drafters['layer_skip'], [REAL_PROMPTS[1]], gamma=4,
                               max_new_tokens=16, policy=fixed)
  assert alone.new_tokens == [reference[1]]
