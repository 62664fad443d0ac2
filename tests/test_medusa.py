"""Medusa heads: exact greedy parity on a tiny Gemma, exact sampling on a toy whose
sequence distribution is known, the hidden state each draft comes from, bad heads.

The distribution toy is a bigram target with hidden states: the hidden state after
token t is H[t] and its logits are H[t] @ E^T, so Medusa heads read a real feature
and score against the target's own embedding, while the target's sequence
distribution is the bigram table H E^T (test_acceptance's exact reference).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling as sampling_lib
from specjax.decoding import draft_length
from specjax.decoding import speculative
from specjax.decoding import tree as tree_lib
from specjax.drafters import base
from specjax.drafters import medusa
from specjax.models.config import tiny_config

import test_acceptance as acc
import toy_models
from test_speculative import MAX_NEW, PADDED, PROMPTS, TARGET, TARGET_PARAMS
from test_speculative import check_greedy_tree, eos_id, greedy_reference, spec_generate

SamplingConfig = sampling_lib.SamplingConfig


def random_heads(num_heads: int, width: int, seed: int, scale: float) -> dict:
  rng = np.random.default_rng(seed)
  return {'w_KxDxD': jnp.asarray(rng.normal(size=(num_heads, width, width)) * scale, jnp.float32),
          'b_KxD': jnp.asarray(rng.normal(size=(num_heads, width)) * scale, jnp.float32)}


def generate(target, params, drafter, prompts, gamma, **kwargs):
  return speculative.generate(target, params, drafter, prompts, gamma=gamma,
                              policy=draft_length.fixed(gamma), **kwargs)


# ------------------------------------------------------------ greedy parity

HEADS = random_heads(5, TARGET.config.embed_dim, seed=0, scale=0.3)
SUBSET = np.arange(0, TARGET.config.vocab_size, 2, dtype=np.int32)  # every other token


@pytest.mark.parametrize('vocab_ids', [None, SUBSET], ids=['full', 'reduced'])
@pytest.mark.parametrize('gamma', [1, 4])
def test_greedy_medusa_equals_greedy_autoregressive(gamma, vocab_ids):
  drafter, drafts = _recording(medusa.make(TARGET, HEADS, vocab_ids_N=vocab_ids))
  out = generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma, max_new_tokens=MAX_NEW,
                 eos_ids=(eos_id(),))
  assert out.new_tokens == greedy_reference()
  assert 0 < sum(out.accepted_tokens) < sum(out.drafted_tokens)  # both outcomes happen
  alone = generate(PADDED, TARGET_PARAMS, drafter, [PROMPTS[2]], gamma, max_new_tokens=MAX_NEW,
                   eos_ids=(eos_id(),))
  assert alone.new_tokens == [greedy_reference()[2]]
  drafted = set(np.concatenate(drafts).ravel().tolist())
  if vocab_ids is not None:
    assert drafted <= set(SUBSET.tolist())   # a reduced head drafts only subset tokens
  else:
    assert any(t % 2 for t in drafted)


def _recording(drafter: base.Drafter):
  drafts = []

  def propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    jax.debug.callback(lambda d: drafts.append(np.asarray(d)), proposal.draft_BxG)
    return proposal

  return dataclasses.replace(drafter, propose=propose), drafts


def test_untrained_heads_draft_from_the_hidden_state_that_made_the_pending_token():
  """W = 0: every head is the target's own head on h, so head 0's draft is the argmax
  at the pending token's source position, i.e. the pending token itself, for every row
  and after every kind of call (prefill, verify with any accepted count, plain step)."""
  drafter = medusa.make(TARGET, medusa.init_heads(2, TARGET.config.embed_dim))
  seen = []

  def spy_propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    tokens_BxS, lengths_B = kwargs['tokens_BxS'], kwargs['lengths_B']
    pending_B = tokens_BxS[jnp.arange(tokens_BxS.shape[0]), lengths_B - 1]
    jax.debug.callback(lambda *a: seen.append([np.asarray(x) for x in a]),
                       proposal.draft_BxG[:, 0], pending_B, lengths_B)
    return proposal

  spy = dataclasses.replace(drafter, propose=spy_propose)
  out = spec_generate(PADDED, TARGET_PARAMS, spy, PROMPTS, gamma=2, max_new_tokens=MAX_NEW,
                      eos_ids=(eos_id(),), adaptive=True)
  assert out.new_tokens == greedy_reference()
  assert sum(out.plain_calls) > 0   # plain steps happen, and proposals after them are checked
  final_B = np.array([len(p) + len(new) for p, new in zip(PROMPTS, out.new_tokens)])
  checked = 0
  for draft_B, pending_B, lengths_B in seen:
    live_B = lengths_B < final_B   # a finished row's state is never used again
    assert np.array_equal(draft_B[live_B], pending_B[live_B])
    checked += live_B.sum()
  assert checked >= sum(len(new) for new in out.new_tokens) // 3


# -------------------------------------------------- exact sampling (chi-square)

D = 4


TOY = toy_models.HiddenBigram(tiny_config(vocab_size=acc.V, embed_dim=D))
_rng = np.random.default_rng(5)
TOY_PARAMS = {'hidden_VxD': jnp.asarray(_rng.normal(size=(acc.V, D)), jnp.float32),
              'embedding_VxD': jnp.asarray(_rng.normal(size=(acc.V, D)) * 0.8, jnp.float32)}
TOY_TABLE = np.asarray(TOY_PARAMS['hidden_VxD'] @ TOY_PARAMS['embedding_VxD'].T)
TOY_HEADS = random_heads(3, D, seed=1, scale=0.7)


def _misaligned_q(drafter: base.Drafter) -> base.Drafter:
  """The bug of scoring draft k with another head's q (rolled along the draft axis)."""

  def propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    return proposal.replace(q_BxGxV=jnp.roll(proposal.q_BxGxV, 1, axis=1))

  return dataclasses.replace(drafter, propose=propose)


def _sample(drafter, cfg, gamma, seed):
  out = generate(TOY, TOY_PARAMS, drafter, [acc.PROMPT] * acc.NUM_SAMPLES, gamma,
                 max_new_tokens=acc.NUM_NEW, sampling=cfg, seed=seed)
  p_value, impossible = acc.check_exact(out.new_tokens, cfg, table=TOY_TABLE)
  assert impossible == 0
  rate = np.sum(out.accepted_tokens) / np.sum(out.drafted_tokens)
  return p_value, rate


@pytest.mark.parametrize('config,vocab_ids', [
    ('t1', None),
    ('topp', None),
    ('t1', np.array([0, 2, 3, 5], np.int32)),   # q is zero outside the draft vocabulary
])
def test_medusa_sampling_is_exact(config, vocab_ids):
  drafter = medusa.make(TOY, TOY_HEADS, vocab_ids_N=vocab_ids)
  p_value, rate = _sample(drafter, acc.CONFIGS[config], gamma=3, seed=7)
  assert p_value > acc.P_VALUE_OK, p_value
  assert 0.03 < rate < 0.95, rate   # neither always right nor always wrong


def test_medusa_distribution_test_rejects_a_misaligned_q():
  drafter = _misaligned_q(medusa.make(TOY, TOY_HEADS))
  p_value, _ = _sample(drafter, acc.CONFIGS['t1'], gamma=3, seed=7)
  assert p_value < acc.P_VALUE_WRONG, p_value


# ------------------------------------------------------------------ bad input

def test_heads_for_another_width_or_a_bad_vocabulary_are_errors():
  with pytest.raises(ValueError, match='heads are 16 wide but the target is 32'):
    medusa.make(TARGET, medusa.init_heads(2, 16))
  with pytest.raises(ValueError, match='draft vocabulary must be ids in'):
    medusa.make(TARGET, HEADS, vocab_ids_N=np.array([0, 64]))


def test_gamma_above_the_number_of_heads_is_an_error():
  drafter = medusa.make(TARGET, medusa.init_heads(2, TARGET.config.embed_dim))
  with pytest.raises(ValueError, match='medusa has 2 heads.*gamma is 3'):
    generate(TARGET, TARGET_PARAMS, drafter, [PROMPTS[0]], 3, max_new_tokens=4)


# ------------------------------------------------------------------ trees

@pytest.mark.parametrize('spec', ['medusa-16', '-1,-1,-1,0,0,1,3'])
def test_greedy_medusa_trees_equal_greedy_autoregressive(spec):
  check_greedy_tree(medusa.make(TARGET, HEADS, vocab_ids_N=SUBSET), tree_lib.parse(spec))


def test_medusa_tree_sampling_is_exact():
  tree = tree_lib.parse('-1,-1,-1,0,0,1,3')
  drafter = medusa.make(TOY, TOY_HEADS)
  cfg = acc.CONFIGS['t1']
  out = speculative.generate(TOY, TOY_PARAMS, drafter, [acc.PROMPT] * acc.NUM_SAMPLES,
                             gamma=tree.max_depth, max_new_tokens=acc.NUM_NEW, sampling=cfg,
                             seed=9, tree=tree)
  probs = acc.exact_sequence_probs(TOY_TABLE, acc.PROMPT[-1], cfg, acc.NUM_NEW)
  counts = acc.sequence_counts(out.new_tokens, acc.NUM_NEW)
  p_value, impossible = acc.chi_square(counts, probs)
  assert impossible == 0 and p_value > acc.P_VALUE_OK, p_value
  assert 0 < sum(out.accepted_tokens) < sum(out.drafted_tokens)


def test_a_tree_deeper_than_the_heads_is_an_error():
  drafter = medusa.make(TARGET, medusa.init_heads(2, TARGET.config.embed_dim))
  with pytest.raises(ValueError, match='at most 2 deep; this tree is 3 deep'):
    speculative.generate(TARGET, TARGET_PARAMS, drafter, [PROMPTS[0]], gamma=3,
                         max_new_tokens=4, tree=tree_lib.parse('-1,0,1'))


def test_a_head_gathered_once_drafts_what_the_per_step_gather_does():
  per_step = medusa.make(TARGET, HEADS, vocab_ids_N=SUBSET)
  once = medusa.make(TARGET, HEADS, vocab_ids_N=SUBSET, target_params=TARGET_PARAMS)
  assert once.params['head_NxD'].shape == (len(SUBSET), TARGET.config.embed_dim)
  a = generate(PADDED, TARGET_PARAMS, per_step, PROMPTS, 3, max_new_tokens=MAX_NEW,
               eos_ids=(eos_id(),))
  b = generate(PADDED, TARGET_PARAMS, once, PROMPTS, 3, max_new_tokens=MAX_NEW,
               eos_ids=(eos_id(),))
  assert a.new_tokens == b.new_tokens == greedy_reference()
  assert a.accepted_tokens == b.accepted_tokens
