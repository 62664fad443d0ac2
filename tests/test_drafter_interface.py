"""Drafter interface v2: drafters see the target's hidden states, evidence drives
the draft length, and a step without evidence is exactly a plain decode step.

Shapes: B batch, S slots, T positions, D width, G gamma, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import drafters
from specjax import sampling as sampling_lib
from specjax.decoding import autoregressive, draft_length, program, speculative
from specjax.decoding import prefill as prefill_lib
from specjax.drafters import base

import toy_models

COUNT_V = 16
COUNT_TABLE = toy_models.count_up_table(COUNT_V)
COUNT_TOY = toy_models.table_model(COUNT_V)


def feature_copy_drafter(vocab: int, *, misalign: int = 0) -> base.Drafter:
  """Drafts from the target's hidden states alone, never reading tokens.

  The table model's hidden state at a position is the token there, so the
  feature at the position before the pending token, plus one, is the pending
  token, and the count-up target continues from it. The drafter is right only
  if `init` and `update` hand it the right features at the right positions;
  `misalign` shifts the index it reads.
  """

  def feature(target: base.TargetView):
    index_B = target.lengths_B - 2 - target.positions_BxT[:, 0] + misalign
    index_B = jnp.clip(index_B, 0, target.hidden_BxTxD.shape[1] - 1)
    return jnp.take_along_axis(target.hidden_BxTxD[..., 0], index_B[:, None], axis=1)[:, 0]

  def init(*, params, target):
    del params
    return feature(target).astype(jnp.int32)

  def update(*, params, state, target):
    del params, state
    return feature(target).astype(jnp.int32)

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del params, tokens_BxS, keys_B, sampling, shared
    draft_BxG = (state[:, None] + 2 + jnp.arange(gamma)[None, :]) % vocab
    return base.Proposal(draft_BxG.astype(jnp.int32), None,
                         jnp.full(lengths_B.shape, gamma, jnp.int32), state)

  return base.Drafter(name='feature_copy', vocab_size=vocab, init=init, update=update,
                      propose=propose)


PROMPTS = [[3], [14, 15, 0, 1, 2], [9, 10, 11, 12]]


@pytest.mark.parametrize('adaptive', [False, True])
def test_a_drafter_fed_the_targets_features_drafts_every_token_right(adaptive):
  gamma, max_new = 3, 17
  policy = (draft_length.Policy((0, 2, 3), (1.0, 1.01, 1.02)) if adaptive
            else draft_length.fixed(gamma))
  out = speculative.generate(COUNT_TOY, COUNT_TABLE, feature_copy_drafter(COUNT_V), PROMPTS,
                             gamma=gamma, max_new_tokens=max_new, policy=policy)
  for b, prompt in enumerate(PROMPTS):
    assert out.new_tokens[b] == [(prompt[-1] + 1 + i) % COUNT_V for i in range(max_new)]
  # 16 tokens after the first, 4 per call: every draft of every call accepted.
  assert out.target_calls == [5, 5, 5]
  assert out.accepted_tokens == [12, 12, 12] and out.drafted_tokens == [12, 12, 12]


def test_update_is_told_how_many_drafts_each_row_verified():
  """The view `update` gets counts each row's verified drafts beside its accepted
  ones (0 in a plain step): with drafts that are always right and evidence that
  varies from step to step (0 in some), every call accepts exactly what it
  verified, and the verified counts add up to what the loop reports drafted."""
  inner = feature_copy_drafter(COUNT_V)
  seen = []

  def update(*, params, state, target):
    jax.debug.callback(lambda v, a: seen.append((np.asarray(v), np.asarray(a))),
                       target.num_verified_B, target.num_accepted_B)
    return inner.update(params=params, state=state, target=target)

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    proposal = inner.propose(params=params, state=state, tokens_BxS=tokens_BxS,
                             lengths_B=lengths_B, keys_B=keys_B, sampling=sampling, gamma=gamma)
    return proposal.replace(num_drafts_B=((lengths_B // 2) % (gamma + 1)).astype(jnp.int32))

  drafter = dataclasses.replace(inner, update=update, propose=propose)
  policy = draft_length.Policy((0, 2, 3), (1.0, 1.01, 1.02))
  out = speculative.generate(COUNT_TOY, COUNT_TABLE, drafter, PROMPTS, gamma=3,
                             max_new_tokens=17, policy=policy)
  for b, prompt in enumerate(PROMPTS):
    assert out.new_tokens[b] == [(prompt[-1] + 1 + i) % COUNT_V for i in range(17)]
  verified_SxB = np.stack([v for v, _ in seen])
  accepted_SxB = np.stack([a for _, a in seen])
  np.testing.assert_array_equal(accepted_SxB, verified_SxB)
  assert (verified_SxB == 0).any() and (verified_SxB > 0).any()
  assert (verified_SxB <= 3).all()
  # Rows that finished keep being stepped (and report) until the batch ends.
  assert (verified_SxB.sum(axis=0) >= np.asarray(out.drafted_tokens)).all()
  assert (verified_SxB.sum(axis=0) - np.asarray(out.drafted_tokens) <= 3).all()


def test_hidden_states_reach_init_and_update_on_a_real_gemma():
  """On the tiny Gemma: the hidden states a drafter receives equal a full forward's
  (final norm and a requested layer) at the positions the view names."""
  model, params = toy_models.tiny_gemma()
  seen = []

  def init(*, params, target):
    del params
    return {'hidden': target.hidden_BxTxD[:, :3], 'layer': target.layer_hidden_LxBxTxD[:, :, :3]}

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del params, tokens_BxS, keys_B, sampling, shared
    return base.Proposal(jnp.zeros((lengths_B.shape[0], gamma), jnp.int32), None,
                         jnp.zeros_like(lengths_B), state)

  drafter = base.Drafter(name='spy', vocab_size=model.config.vocab_size, init=init,
                         update=base.no_state_update, propose=propose, hidden_layers=(1,))
  loop = program.Loop(target=model, sampling=sampling_lib.SamplingConfig(), eos_ids=(),
                      prefill_len=16, drafter=drafter, gamma=2, policy=draft_length.fixed(2))
  packed = program.pack(model, [[2, 5, 9, 11]], max_new_tokens=4, extra_slots=3)
  tokens = jnp.asarray(packed.tokens_BxS)
  state, out = prefill_lib.start(model, params, tokens, jnp.asarray(packed.lengths_B),
                                 jnp.asarray([4]), sampling_lib.row_keys(0, [0]),
                                 jnp.asarray(packed.active_B), prefill_len=16,
                                 sampling=loop.sampling, eos_ids=(), hidden_layers=(1,))
  del state
  full = model.forward(params, tokens[:, :3], jnp.arange(3)[None], model.init_cache(1, 16),
                       hidden_layers=(1,))
  np.testing.assert_allclose(out.hidden_BxTxD[:, :3], full.hidden_BxTxD, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(out.layer_hidden_LxBxTxD[:, :, :3], full.layer_hidden_LxBxTxD,
                             rtol=1e-5, atol=1e-4)
  assert float(jnp.abs(full.hidden_BxTxD).max()) > 0.1
  del seen


def test_a_step_without_evidence_is_a_plain_decode_step():
  """With no row drafting, one speculative step leaves the tokens, lengths and the
  KV cache exactly as autoregressive.decode_step does."""
  model, params = toy_models.tiny_gemma()
  ngram = drafters.make_drafter('ngram', target=model)
  gamma = 3
  policy = draft_length.Policy((0, 2, 3), (1.0, 1.01, 1.02))
  packed = program.pack(model, [[2, 5, 9, 11], [7, 1, 3]], max_new_tokens=8,
                        extra_slots=gamma + 1)
  sampling = sampling_lib.SamplingConfig()
  loop = program.Loop(target=model, sampling=sampling, eos_ids=(),
                      prefill_len=packed.prefill_len, drafter=ngram, gamma=gamma, policy=policy)
  keys_B = sampling_lib.row_keys(0, packed.row_ids_B)
  max_new_B = jnp.full((2,), 8, jnp.int32)

  @jax.jit
  def both(params):
    decode, _ = prefill_lib.start(model, params, jnp.asarray(packed.tokens_BxS),
                                  jnp.asarray(packed.lengths_B), max_new_B, keys_B,
                                  jnp.asarray(packed.active_B), prefill_len=packed.prefill_len,
                                  sampling=sampling, eos_ids=())
    plain, _ = autoregressive.decode_step(model, params, keys_B, max_new_B, loop, decode)
    batch = decode.tokens_BxS.shape[0]
    state = speculative.SpecState(
        decode, (), draft_length.History.init(batch),
        speculative.Counters.zeros(batch, gamma, len(policy.buckets)))
    costs = draft_length.cost_data(policy)
    spec = speculative._step(loop, params, None, costs, keys_B, max_new_B, state)  # pylint: disable=protected-access
    return plain, spec

  plain, spec = both(params)
  # No prompt repeats its last token, so n-gram has no evidence and drafts nothing.
  assert spec.counters.plain_calls_B.tolist() == [1, 1]
  assert spec.counters.drafted_B.tolist() == [0, 0]
  assert spec.counters.width_calls_N.tolist() == [1] + [0] * (len(policy.buckets) - 1)
  np.testing.assert_array_equal(spec.decode.tokens_BxS, plain.tokens_BxS)
  np.testing.assert_array_equal(spec.decode.lengths_B, plain.lengths_B)
  for a, b in zip(jax.tree.leaves(spec.decode.cache), jax.tree.leaves(plain.cache)):
    np.testing.assert_array_equal(a, b)


def test_adaptive_ngram_takes_plain_steps_where_it_has_no_match():
  """Count-up from a prompt with no repetition: n-gram never matches, so every call
  is a plain step (the fixed policy would verify gamma useless drafts each time)."""
  vocab = 64
  toy = toy_models.table_model(vocab)
  ngram = drafters.make_drafter('ngram', target=toy)
  out = speculative.generate(toy, toy_models.count_up_table(vocab), ngram, [[0]], gamma=3,
                             max_new_tokens=10,
                             policy=draft_length.Policy((0, 2, 3), (1.0, 1.01, 1.02)))
  assert out.new_tokens == [list(range(1, 11))]
  assert out.plain_calls == [9] and out.drafted_tokens == [0]
  assert out.width_calls == [9, 0, 0] and out.steps == 9


def test_width_calls_count_the_batchs_steps_per_branch():
  """A repeating prompt gives n-gram matches: some steps verify drafts, the
  counts per width sum to the loop's steps, and a step that verified drafts of
  any row is counted in a bucket above the plain one."""
  vocab = 64
  toy = toy_models.table_model(vocab)
  ngram = drafters.make_drafter('ngram', target=toy)
  prompts = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 7]]
  out = speculative.generate(toy, toy_models.count_up_table(vocab), ngram, prompts, gamma=3,
                             max_new_tokens=12,
                             policy=draft_length.Policy((0, 2, 3), (1.0, 1.01, 1.02)))
  assert sum(out.width_calls) == out.steps
  assert sum(out.width_calls[1:]) >= max(c - p - 1 for c, p in zip(out.target_calls,
                                                                   out.plain_calls)) > 0


@pytest.mark.parametrize('name, values, message', [
    ('ngram', {'max_m': 3}, r'config.ngram has unknown setting\(s\) max_m; known: max_n, min_n'),
    ('ngram', {'max_n': '3'}, r"config.ngram.max_n must be a int, got '3'"),
    ('ngram', {'max_n': 0}, r'config.ngram.min_n / max_n need 1 <= min_n <= max_n'),
    ('early_exit', {'layers': 2.5}, r'config.early_exit.layers must be a int, got 2.5'),
    ('early_exit', {'min_confidence': 1.5}, r'config.early_exit.min_confidence must be in'),
    ('draft_model', {'checkpoint': 3}, r'config.draft_model.checkpoint must be a str'),
    ('eagle', {'min_confidence': -0.1}, r'config.eagle.min_confidence must be in'),
    ('eagle', {'checkpoint': 1}, r'config.eagle.checkpoint must be a str'),
    ('hydra', {}, r"unknown drafter 'hydra'"),
    ('medusa', {'heads': 4}, r'config.medusa has unknown setting\(s\) heads'),
])
def test_bad_nested_drafter_settings_are_clear_errors(name, values, message):
  with pytest.raises(ValueError, match=message):
    drafters.settings_for(name, values)


@pytest.mark.parametrize('draft_costs', [(0.0, 0.1), (0.0, 0.1, -0.1), (0.0, 0.1, 1.5)])
def test_draft_costs_are_a_part_of_each_buckets_cost(draft_costs):
  with pytest.raises(ValueError, match='draft_costs .* must be empty or, for each bucket, at '
                                       'least 0 and below its cost'):
    draft_length.Policy((0, 2, 4), (1.0, 1.2, 1.5), draft_costs=draft_costs)
  ok = draft_length.Policy((0, 2, 4), (1.0, 1.2, 1.5), draft_costs=(0.0, 0.1, 0.4))
  data = draft_length.cost_data(ok)
  np.testing.assert_allclose(data['total_N'], [1.0, 1.2, 1.5])
  np.testing.assert_allclose(data['drafting_N'], [0.0, 0.1, 0.4])
  np.testing.assert_array_equal(
      draft_length.cost_data(draft_length.Policy((0, 2), (1.0, 1.2)))['drafting_N'], [0.0, 0.0])


def test_choose_prefers_a_plain_step_for_a_large_batch_with_expensive_calls():
  """Batch-aware: the same evidence drafts at batch 1 and not when a call over
  gamma + 1 positions costs as much as several decode steps."""
  history = draft_length.History.init(1)
  cheap = draft_length.Policy((0, 2, 4), (1.0, 1.2, 1.5))
  dear = draft_length.Policy((0, 2, 4), (1.0, 3.0, 5.0))
  evidence = jnp.asarray([4])
  live = jnp.asarray([True])
  def choose(policy, evidence_B):
    return int(draft_length.choose(policy, jnp.asarray(policy.costs), history, evidence_B,
                                   live, jnp.asarray([100]))[0])
  assert choose(cheap, evidence) > 0
  assert choose(dear, evidence) == 0
  assert choose(cheap, jnp.asarray([0])) == 0


def test_default_widths_keep_a_short_call_within_a_batchs_reach():
  """Widths step by 2 up to gamma: where only a short call pays (a batch, whose long calls
  are compute-bound), gamma 6 still offers it, as (0, 3, 6) would not."""
  assert [draft_length.default_buckets(g) for g in (1, 2, 3, 4, 5, 6, 8)] == [
      (0, 1), (0, 1, 2), (0, 2, 3), (0, 2, 4), (0, 2, 4, 5), (0, 2, 4, 6), (0, 2, 4, 6, 8)]
  cost_of = {0: 1.0, 2: 1.3, 3: 2.2, 4: 2.6, 6: 3.8}   # per call, in decode steps
  def width(buckets):
    policy = draft_length.Policy(buckets, tuple(cost_of[n] for n in buckets))
    index, _ = draft_length.choose(policy, jnp.asarray(policy.costs),
                                   draft_length.History.init(1), jnp.asarray([6]),
                                   jnp.asarray([True]), jnp.asarray([100]))
    return buckets[int(index)]
  assert width(draft_length.default_buckets(6)) == 2
  assert width((0, 3, 6)) == 0


def test_choose_follows_the_rows_that_set_the_batchs_finishing_time():
  """A batch finishes with its slowest row: when the row left behind has no
  evidence, a call whose cost only the leading rows repay is not worth it, and
  it is when the laggards are the ones with evidence. An infinite softness
  gives back the mean over rows; a finished row counts for nothing."""
  policy = draft_length.Policy((0, 2, 4), (1.0, 1.5, 1.9))
  costs = jnp.asarray(policy.costs)
  history = draft_length.History(jnp.asarray([20.0, 20.0, 20.0, 20.0]), jnp.zeros((4,)))
  live = jnp.ones((4,), bool)
  # Three rows with a full match (a ~0.95), one row without one.
  evidence = jnp.asarray([4, 4, 4, 0])

  def width(remaining, policy=policy, live=live):
    index, k_B = draft_length.choose(policy, costs, history, evidence, live, jnp.asarray(remaining))
    assert k_B.tolist() == [min(int(e), policy.buckets[int(index)]) for e in evidence.tolist()]
    return policy.buckets[int(index)]

  assert width([50, 50, 50, 50]) == 4      # level rows: any of them may end last
  assert width([40, 40, 40, 50]) == 0      # the row without evidence lags by 10 tokens
  assert width([50, 50, 50, 40]) == 4      # the laggards have evidence
  summing = dataclasses.replace(policy, finish_softness=float('inf'))
  assert width([40, 40, 40, 50], policy=summing) == 4
  assert width([40, 40, 40, 50], live=jnp.asarray([True, True, True, False])) == 4
  sharp = dataclasses.replace(policy, finish_softness=0.25)
  assert width([50, 50, 50, 50], policy=sharp) == 0   # the match-less row is the maximum
  with pytest.raises(ValueError, match='finish_softness'):
    draft_length.Policy((0, 4), (1.0, 1.9), finish_softness=0.0)


def test_a_steps_worth_is_its_reduction_of_the_smooth_maximum():
  """At batch 1 it is the expected tokens (the tokens-per-cost rule), a plain
  step is worth exactly 1 at any batch, and no row gains more than it has left."""
  policy = draft_length.Policy((0, 4), (1.0, 1.9))
  live = jnp.ones((3,), bool)
  one = draft_length.finish_reduction(policy, jnp.asarray([30]), jnp.asarray([[1.0], [3.2]]),
                                      jnp.asarray([True]))
  np.testing.assert_allclose(one, [1.0, 3.2], rtol=1e-5)
  plain = draft_length.finish_reduction(policy, jnp.asarray([30, 12, 29]),
                                        jnp.ones((1, 3)), live)
  np.testing.assert_allclose(plain, [1.0], rtol=1e-5)
  capped = draft_length.finish_reduction(policy, jnp.asarray([2]), jnp.asarray([[4.0]]),
                                         jnp.asarray([True]))
  np.testing.assert_allclose(capped, [2.0], rtol=1e-5)


def test_expected_tokens_is_leviathans_formula():
  a, k = 0.6, 4
  assert float(draft_length.expected_tokens(jnp.asarray([a]), jnp.asarray([k]))[0]) == \
      pytest.approx((1 - a ** (k + 1)) / (1 - a), rel=1e-6)


def test_committed_samples_follow_the_truncated_geometric_law():
  """Each outcome commits 1 + the accepted prefix, at most k + 1 tokens; their
  mean is Leviathan's expected tokens, and no draft means exactly one token."""
  a_B = jnp.asarray([0.05, 0.3, 0.6, 0.9, 0.99])
  k_NxB = jnp.asarray([[0] * 5, [2] * 5, [4] * 5, [7] * 5])
  x_SxNxB = np.asarray(draft_length.committed_samples(a_B, k_NxB, 256))
  assert x_SxNxB.shape == (256, 4, 5)
  assert np.array_equal(x_SxNxB, np.round(x_SxNxB))
  assert (x_SxNxB >= 1).all() and (x_SxNxB <= np.asarray(k_NxB)[None] + 1).all()
  assert (x_SxNxB[:, 0] == 1).all()
  expected_NxB = draft_length.expected_tokens(a_B[None, :], k_NxB)
  np.testing.assert_allclose(x_SxNxB.mean(axis=0), expected_NxB, rtol=0.02)
  # The share of outcomes that accept the whole chain is a^k.
  np.testing.assert_allclose((x_SxNxB[:, 2] == 5).mean(axis=0), np.asarray(a_B) ** 4, atol=0.01)


def test_a_batch_call_is_worth_no_more_over_outcomes_than_at_expected_tokens():
  """The smooth maximum is convex, so averaging its reduction over outcomes never
  values a call above the reduction at each row's expected tokens (Jensen), and
  a plain step is still worth exactly 1."""
  rng = np.random.default_rng(0)
  policy = draft_length.Policy((0, 2, 4), (1.0, 1.5, 1.9), finish_softness=2.0)
  for _ in range(20):
    batch = int(rng.integers(2, 17))
    a_B = jnp.asarray(rng.uniform(0.05, 0.95, batch), jnp.float32)
    evidence_B = jnp.asarray(rng.integers(0, 5, batch))
    remaining_B = jnp.asarray(rng.integers(5, 60, batch))
    live_B = jnp.asarray(rng.random(batch) < 0.9).at[0].set(True)
    k_NxB = jnp.minimum(evidence_B[None, :], jnp.asarray(policy.buckets)[:, None])
    at_mean = draft_length.finish_reduction(
        policy, remaining_B, draft_length.expected_tokens(a_B[None, :], k_NxB), live_B)
    over = draft_length.finish_reduction(
        policy, remaining_B, draft_length.committed_samples(a_B, k_NxB, 256), live_B)
    assert float(over[0]) == pytest.approx(1.0, abs=1e-5)
    assert (np.asarray(over) <= np.asarray(at_mean) + 0.02).all()


def test_a_large_level_batch_does_not_verify_on_the_prior_alone():
  """Sixteen level rows, each with a match but no history (acceptance at the
  prior, 0.5), and calls that cost what they cost a 2-core CPU at batch 16:
  valued at expected tokens every row gains 1.75 and a call over 2 drafts looks
  worth its 1.53 decode steps; over outcomes, some row almost surely rejects its
  first draft and stays the maximum, so the step is a plain one. Rows with a
  strong history still verify."""
  policy = draft_length.Policy((0, 2, 4), (1.0, 1.53, 2.15), finish_softness=1.0)
  costs = jnp.asarray(policy.costs)
  live = jnp.ones((16,), bool)
  evidence = jnp.full((16,), 4)
  remaining = jnp.full((16,), 100)
  fresh = draft_length.History.init(16)
  at_mean = dataclasses.replace(policy, outcome_samples=0)
  assert int(draft_length.choose(at_mean, costs, fresh, evidence, live, remaining)[0]) > 0
  assert int(draft_length.choose(policy, costs, fresh, evidence, live, remaining)[0]) == 0
  proven = draft_length.History(jnp.full((16,), 40.0), jnp.zeros((16,)))
  assert int(draft_length.choose(policy, costs, proven, evidence, live, remaining)[0]) > 0
  with pytest.raises(ValueError, match='outcome_samples'):
    draft_length.Policy((0, 4), (1.0, 1.9), outcome_samples=-1)


def test_pooled_prior_is_the_other_rows_rate_and_the_fixed_prior_at_batch_1():
  """A row's prior mean is what the other rows showed: a fresh row beside rows
  that rejected is estimated below the prior, beside rows that accepted above
  it, and its own counts outweigh the pool as they grow. At batch 1, and with
  pool_rows off, the estimate is the fixed prior's."""
  policy = draft_length.Policy((0, 2), (1.0, 1.3), pool_rows=True)
  own = dataclasses.replace(policy, pool_rows=False)
  one = draft_length.History(jnp.asarray([3.0]), jnp.asarray([1.0]))
  expected = (3.0 + policy.prior * policy.prior_weight) / (4.0 + policy.prior_weight)
  for p in (policy, own):
    assert float(one.acceptance(p)[0]) == pytest.approx(expected)
  rejecting = draft_length.History(jnp.asarray([0.0, 0.0, 0.0]), jnp.asarray([0.0, 1.0, 1.0]))
  accepting = draft_length.History(jnp.asarray([0.0, 6.0, 6.0]), jnp.asarray([0.0, 1.0, 1.0]))
  assert float(rejecting.acceptance(policy)[0]) < policy.prior
  assert float(accepting.acceptance(policy)[0]) > policy.prior
  assert float(rejecting.acceptance(own)[0]) == pytest.approx(policy.prior)
  # A rejecting row beside another rejecting one: its prior mean (1 + 0) / (2 + 1) = 1/3,
  # so (0 + 2/3) / (2 + 1) = 2/9, against 1/3 on the fixed prior alone.
  np.testing.assert_allclose(rejecting.acceptance(policy)[1:], 2.0 / 9.0, rtol=1e-6)
  np.testing.assert_allclose(rejecting.acceptance(own)[1:], 1.0 / 3.0, rtol=1e-6)
  proven = draft_length.History(jnp.asarray([40.0, 0.0, 0.0]), jnp.asarray([2.0, 5.0, 5.0]))
  assert float(proven.acceptance(policy)[0]) > 0.9


def test_a_batch_whose_rows_all_rejected_stops_drafting_at_once():
  """Four level rows with matches; three rejected their first drafts and the
  fourth has not drafted yet. With each row on its own prior the fresh row
  (the prior's 0.5) still makes a call worth its cost; pooled, the batch's
  evidence that drafts fail here takes a plain step."""
  policy = draft_length.Policy((0, 2, 4), (1.0, 1.3, 2.0), finish_softness=1.0, pool_rows=True)
  own = dataclasses.replace(policy, pool_rows=False)
  costs = jnp.asarray(policy.costs)
  live, evidence = jnp.ones((4,), bool), jnp.full((4,), 4)
  remaining = jnp.asarray([60, 50, 50, 50])   # the fresh row lags: it sets the finishing time
  history = draft_length.History(jnp.zeros((4,)), jnp.asarray([0.0, 1.0, 1.0, 1.0]))
  assert int(draft_length.choose(own, costs, history, evidence, live, remaining)[0]) > 0
  assert int(draft_length.choose(policy, costs, history, evidence, live, remaining)[0]) == 0


def test_drafts_past_what_a_row_has_left_are_worth_nothing():
  """With 3 tokens left a call over 2 drafts commits as much as one over 4, so the
  cheaper one is taken; taking min(E, R) instead valued the fourth draft."""
  policy = draft_length.Policy((0, 2, 4), (1.0, 1.4, 1.8))
  proven = draft_length.History(jnp.asarray([40.0]), jnp.zeros((1,)))
  live, evidence = jnp.asarray([True]), jnp.asarray([4])
  def width(remaining):
    index, _ = draft_length.choose(policy, jnp.asarray(policy.costs), proven, evidence, live,
                                   jnp.asarray([remaining]))
    return policy.buckets[int(index)]
  assert width(40) == 4
  assert width(3) == 2
  assert width(1) == 0   # one token left: a plain step commits it
