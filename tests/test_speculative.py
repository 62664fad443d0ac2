"""The speculative loop: exact parity with plain decoding, predicted metrics, drafters.

Real-model tests use a tiny random Gemma (tests/toy_models.py) whose greedy
continuation is varied; toy tests use table targets whose behaviour is known, so
metrics are predicted exactly. Programs are compiled once per (target, drafter,
gamma, sampling) and reused: a batch of one runs on a target padded to 4 rows
(as on a data-parallel mesh), which also exercises inactive padding rows.
"""

from __future__ import annotations

import functools
import math

import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding import autoregressive
from specjax import sampling as sampling_lib
from specjax.decoding import draft_length
from specjax.decoding import speculative
from specjax.decoding import tree as tree_lib
from specjax.drafters import make_drafter
from specjax.drafters import ngram as ngram_lib

import toy_models

SamplingConfig = sampling_lib.SamplingConfig

TARGET, TARGET_PARAMS = toy_models.tiny_gemma()
DRAFT, DRAFT_PARAMS = toy_models.small_draft_gemma()
PADDED = toy_models.RowPadded(TARGET, data_parallelism=4)

DRAFTERS = {
    'ngram': make_drafter('ngram', target=TARGET),
    'draft_model': make_drafter('draft_model', target=TARGET, draft_model=(DRAFT, DRAFT_PARAMS)),
    'early_exit': make_drafter('early_exit', target=TARGET, settings={'layers': 2}),
    # The target drafting for itself: greedy acceptance must be total.
    'self_draft': make_drafter('draft_model', target=TARGET,
                               draft_model=(TARGET, TARGET_PARAMS)),
}

PROMPTS = [(2, 5, 9, 11), (7,), tuple(range(30, 42)), (1, 60, 3)]   # mixed lengths


def spec_generate(*args, adaptive=False, **kwargs):
  """speculative.generate with a fixed draft length (every row verifies gamma drafts,
  so counts are known), or the adaptive policy with verify calls dear enough that
  drafting pays near the prior's acceptance (0.5) and not much below: rows with
  evidence and a good history draft, the others take plain steps, and a costly
  drafter, whose width is chosen before it drafts, drafts some steps and not others."""
  gamma = kwargs['gamma']
  if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
    return speculative.generate(*args, **kwargs)   # so generate's own check reports it
  if adaptive:
    # The costs are set for a call valued at expected tokens (outcome_samples=0);
    # valued over outcomes a batch of 4 drafts less. That rule runs in the loop in
    # test_outcome_valued_policy_in_the_loop_is_exact.
    buckets = draft_length.default_buckets(gamma)
    kwargs['policy'] = draft_length.Policy(buckets, tuple(1.0 + 0.27 * n for n in buckets),
                                           outcome_samples=0)
  else:
    kwargs['policy'] = draft_length.fixed(gamma)
  return speculative.generate(*args, **kwargs)
MAX_NEW = 20    # 19 tokens after the first: ends mid-block for gamma + 1 in {2, 4, 8}
GAMMAS = (1, 3, 7)


@functools.cache
def plain_greedy() -> list[list[int]]:
  """Greedy continuations without EOS, by full forward passes (no decoding loop)."""
  return [toy_models.reference_greedy(TARGET, TARGET_PARAMS, p, MAX_NEW) for p in PROMPTS]


@functools.cache
def eos_id() -> int:
  """A token some row produces at an odd index >= 3 and another row never does.

  With full acceptance, new token e (0-based; 0 is the prefill's) sits at place
  (e - 1) % (gamma + 1) of its verify block, which for odd e and odd gamma is
  never the block's last: EOS lands inside an accepted block and cuts it.
  """
  outs = plain_greedy()
  best = None
  for token in range(TARGET.config.vocab_size):
    firsts = [out.index(token) if token in out else None for out in outs]
    if None not in firsts:
      continue
    odd = [e for e in firsts if e is not None and e % 2 == 1 and 3 <= e <= 15]
    if odd and (best is None or max(odd) > best[0]):
      best = (max(odd), token)
  assert best is not None, f'no usable EOS in {outs}'
  return best[1]


def cut_at_eos(tokens, eos):
  return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


@functools.cache
def greedy_reference() -> list[list[int]]:
  return [cut_at_eos(out, eos_id()) for out in plain_greedy()]


def check_greedy_tree(drafter, tree) -> list:
  """A drafter's greedy `tree` and the chain of its depth both give the reference
  output at batch 4 of mixed lengths, and the tree, which also tries runners-up,
  accepts no fewer tokens than the chain."""
  runs = [speculative.generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=tree.max_depth,
                               max_new_tokens=MAX_NEW, eos_ids=(eos_id(),), tree=t)
          for t in (tree, tree_lib.chain(tree.max_depth))]
  for out in runs:
    assert out.new_tokens == greedy_reference()
  assert sum(runs[1].accepted_tokens) <= sum(runs[0].accepted_tokens)
  return runs


def check_metric_invariants(out, gamma, adaptive=False):
  for b, new in enumerate(out.new_tokens):
    verify = out.target_calls[b] - 1
    accepted, at = out.accepted_tokens[b], out.accepted_at_position[b]
    drafted = out.drafted_tokens[b]
    if not adaptive:   # every call verifies gamma drafts; only the last may be cut
      assert gamma * (verify - 1) <= drafted <= gamma * verify
    assert 0 <= accepted <= drafted <= gamma * verify
    assert accepted <= len(new) - 1   # accepted drafts were all committed
    assert sum(at) == accepted
    assert all(at[i] >= at[i + 1] for i in range(gamma - 1))   # accepts are a prefix
    assert at[0] <= verify
    # Each verify call commits its accepted drafts and one more token (the last may be cut).
    assert verify <= len(new) - 1 <= accepted + verify
    assert len(new) - 1 > accepted + verify - (gamma + 1) or verify == 0


# ------------------------------------------------------------- greedy parity

def test_eos_setup_is_what_the_parity_tests_need():
  ref, eos = greedy_reference(), eos_id()
  assert any(len(r) < MAX_NEW and r[-1] == eos for r in ref)   # some row ends at EOS
  assert any(len(r) == MAX_NEW and eos not in r for r in ref)   # some row runs out of budget


def test_autoregressive_greedy_matches_full_forward_passes():
  """So that parity with autoregressive decoding is parity with the model."""
  out = autoregressive.generate(PADDED, TARGET_PARAMS, PROMPTS, max_new_tokens=MAX_NEW,
                                eos_ids=(eos_id(),))
  assert out.new_tokens == greedy_reference()


@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
@pytest.mark.parametrize('gamma', GAMMAS)
@pytest.mark.parametrize('name', list(DRAFTERS))
def test_greedy_speculative_equals_greedy_autoregressive(name, gamma, adaptive):
  drafter, eos = DRAFTERS[name], (eos_id(),)
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=gamma,
                      max_new_tokens=MAX_NEW, eos_ids=eos, adaptive=adaptive)
  assert out.new_tokens == greedy_reference()
  check_metric_invariants(out, gamma, adaptive)
  assert out.steps == max(out.target_calls) - 1    # the loop stops when the last row is done
  for i, prompt in enumerate(PROMPTS):   # each prompt alone (plus 3 padding rows)
    alone = spec_generate(PADDED, TARGET_PARAMS, drafter, [prompt], gamma=gamma,
                          max_new_tokens=MAX_NEW, eos_ids=eos, adaptive=adaptive)
    assert alone.new_tokens == [greedy_reference()[i]]
    if not adaptive:   # the adaptive width is chosen for the whole batch
      assert alone.target_calls == [out.target_calls[i]]
    assert alone.steps == alone.target_calls[0] - 1   # padding rows never keep it running
  if name == 'self_draft' and not adaptive:
    # The drafter saw every committed token (the bonus one included): every draft of
    # every verify call is accepted, and the calls are exactly those of full blocks.
    for b, new in enumerate(out.new_tokens):
      verify = out.target_calls[b] - 1
      assert verify == math.ceil((len(new) - 1) / (gamma + 1)), b
      cut = (len(new) - 1) - (gamma + 1) * (verify - 1)   # tokens the last call committed
      assert out.accepted_tokens[b] == gamma * (verify - 1) + min(gamma, cut), b


def test_batch_of_one_without_padding():
  """A true [1, S] batch (the other tests pad a batch of one to 4 rows)."""
  for i in (0, 1):
    out = spec_generate(TARGET, TARGET_PARAMS, DRAFTERS['ngram'], [PROMPTS[i]], gamma=7,
                               max_new_tokens=MAX_NEW, eos_ids=(eos_id(),))
    assert out.new_tokens == [greedy_reference()[i]]


def test_drafters_do_get_drafts_accepted_and_rejected():
  """Parity tests are only strong if both acceptance and rejection happen."""
  for name in ('ngram', 'draft_model', 'early_exit'):
    out = spec_generate(PADDED, TARGET_PARAMS, DRAFTERS[name], PROMPTS, gamma=3,
                               max_new_tokens=MAX_NEW, eos_ids=(eos_id(),))
    accepted, drafted = sum(out.accepted_tokens), sum(out.drafted_tokens)
    assert 0 < accepted < drafted, (name, accepted, drafted)


# ------------------------------------------------ sampled: rows are independent

SAMPLED = SamplingConfig(temperature=0.8, top_k=24, top_p=0.95)


@pytest.mark.parametrize('name', ['ngram', 'draft_model', 'early_exit'])
def test_sampled_rows_equal_the_row_alone(name):
  drafter, eos, seed = DRAFTERS[name], (eos_id(),), 3
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=3,
                             max_new_tokens=MAX_NEW, sampling=SAMPLED, eos_ids=eos, seed=seed,
                             row_ids=[10, 11, 12, 13])
  assert out.new_tokens != greedy_reference()   # sampling did happen
  for i, prompt in enumerate(PROMPTS):
    alone = spec_generate(PADDED, TARGET_PARAMS, drafter, [prompt], gamma=3,
                                 max_new_tokens=MAX_NEW, sampling=SAMPLED, eos_ids=eos,
                                 seed=seed, row_ids=[10 + i])
    assert alone.new_tokens == [out.new_tokens[i]], i
    assert alone.accepted_tokens == [out.accepted_tokens[i]], i
  order = [2, 0, 3, 1]
  shuffled = spec_generate(PADDED, TARGET_PARAMS, drafter, [PROMPTS[i] for i in order],
                                  gamma=3, max_new_tokens=MAX_NEW, sampling=SAMPLED,
                                  eos_ids=eos, seed=seed, row_ids=[10 + i for i in order])
  assert shuffled.new_tokens == [out.new_tokens[i] for i in order]


def test_sampled_row_alone_without_padding():
  drafter, eos = DRAFTERS['ngram'], (eos_id(),)
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=3,
                             max_new_tokens=MAX_NEW, sampling=SAMPLED, eos_ids=eos, seed=3,
                             row_ids=[10, 11, 12, 13])
  for i in (0, 2):
    alone = spec_generate(TARGET, TARGET_PARAMS, drafter, [PROMPTS[i]], gamma=3,
                                 max_new_tokens=MAX_NEW, sampling=SAMPLED, eos_ids=eos, seed=3,
                                 row_ids=[10 + i])
    assert alone.new_tokens == [out.new_tokens[i]]


# ------------------------------------------- toy targets: metrics known exactly

COUNT_V = 16
COUNT_TABLE = toy_models.count_up_table(COUNT_V)
COUNT_TOY = toy_models.table_model(COUNT_V)
NGRAM_TOY = make_drafter('ngram', target=COUNT_TOY)


def full_blocks(num_new: int, per_call: int) -> int:
  """Verify calls to commit num_new tokens (the first comes from prefill)."""
  return math.ceil((num_new - 1) / per_call)


@pytest.mark.parametrize('gamma', GAMMAS)
def test_count_up_with_ngram_accepts_every_draft(gamma):
  # Each prompt holds a whole cycle, so the latest n-gram match predicts the rest.
  prompts = [list(range(COUNT_V)) + [0, 1, 2], list(range(9, COUNT_V)) + list(range(11))]
  num_new = 13
  out = spec_generate(COUNT_TOY, COUNT_TABLE, NGRAM_TOY, prompts, gamma=gamma,
                             max_new_tokens=num_new)
  verify = full_blocks(num_new, gamma + 1)
  last = (num_new - 1) - (gamma + 1) * (verify - 1)   # committed by the last call
  for b, prompt in enumerate(prompts):
    assert out.new_tokens[b] == [(prompt[-1] + 1 + i) % COUNT_V for i in range(num_new)]
    assert out.target_calls[b] == 1 + verify
    assert out.accepted_tokens[b] == gamma * (verify - 1) + min(gamma, last)
  if gamma == 3:   # by hand: 12 tokens after the first, 4 per call -> 3 calls
    assert out.target_calls == [4, 4] and out.accepted_tokens == [9, 9]


def test_count_up_with_ngram_and_no_match_accepts_nothing():
  vocab = 64
  out = spec_generate(toy_models.table_model(vocab), toy_models.count_up_table(vocab),
                             make_drafter('ngram', target=toy_models.table_model(vocab)), [[0]],
                             gamma=3, max_new_tokens=MAX_NEW)
  assert out.new_tokens == [list(range(1, MAX_NEW + 1))]
  assert out.target_calls == [MAX_NEW] and out.accepted_tokens == [0]
  assert out.accepted_at_position == [[0, 0, 0]]


RIGHT_K = (0, 1, 2, 5)
RIGHT_FOR_K = toy_models.right_for_k_drafter(COUNT_V, RIGHT_K)
# Mixed lengths and last tokens: EOS (10) ends rows 0, 1 and 3 at different places,
# the token budget cuts row 2 mid-block.
RIGHT_PROMPTS = [[3], [14, 15, 0, 1, 2, 3, 4], [9, 10, 11], [12, 13]]
RIGHT_EOS = 10


def predicted(prompt, k, gamma, max_new, eos):
  """By hand: count up until EOS or the budget; min(k, gamma) drafts accepted per
  call. The last call commits what is left; drafts past that cut count as neither
  drafted nor accepted."""
  new = []
  while len(new) < max_new and (not new or new[-1] != eos):
    new.append(((new or prompt)[-1] + 1) % COUNT_V)
  accept = min(k, gamma)
  verify = full_blocks(len(new), accept + 1)
  last = (len(new) - 1) - (accept + 1) * (verify - 1)
  cut = last < accept + 1
  accepted = accept * (verify - 1) + min(accept, last)
  drafted = gamma * (verify - 1) + (min(gamma, last) if cut else gamma)
  at = [verify - 1 + (i < min(accept, last)) if i < accept else 0 for i in range(gamma)]
  return new, 1 + verify, accepted, drafted, at


@pytest.mark.parametrize('sampling', [SamplingConfig(), SamplingConfig(temperature=1.0)],
                         ids=['greedy', 'sampled'])
@pytest.mark.parametrize('gamma', [1, 3, 4])
def test_right_for_k_drafter_accepts_exactly_min_k_gamma_per_row(gamma, sampling):
  """Rows accept different numbers of drafts in one batch: no lockstep."""
  max_new = 14
  out = spec_generate(COUNT_TOY, COUNT_TABLE, RIGHT_FOR_K, RIGHT_PROMPTS, gamma=gamma,
                             max_new_tokens=max_new, sampling=sampling, eos_ids=(RIGHT_EOS,))
  for b, (prompt, k) in enumerate(zip(RIGHT_PROMPTS, RIGHT_K)):
    new, calls, accepted, drafted, at = predicted(prompt, k, gamma, max_new, RIGHT_EOS)
    assert out.new_tokens[b] == new, b
    assert out.target_calls[b] == calls, b
    assert out.accepted_tokens[b] == accepted, b
    assert out.accepted_at_position[b] == at, b
    assert out.drafted_tokens[b] == drafted, b
  if gamma == 3:
    # By hand, row 2 (k = 2): the budget cuts [12, ..., 15, 0, ..., 9] before EOS 10;
    # 13 after the first at 3 per call -> 5 calls, the last committing 1 token: 4 x 2 + 1
    # accepted drafts (counting the cut call's 2 would exceed what was committed).
    assert out.new_tokens[2] == [12, 13, 14, 15] + list(range(10))
    assert (out.target_calls[2], out.accepted_tokens[2], out.drafted_tokens[2]) == (6, 9, 13)
    # Row 0 (k = 0): [4, ..., 10] is 7 tokens, one per call after the first.
    assert (out.target_calls[0], out.accepted_tokens[0]) == (7, 0)


def test_padding_rows_do_not_keep_the_loop_running():
  """A batch of one padded to 4 rows: only the real row decides when the loop ends.
  Were the 3 padding rows live, their drafts (k = 0) would take 19 steps, not 3."""
  padded = toy_models.RowPadded(COUNT_TOY, data_parallelism=4)
  drafter = toy_models.right_for_k_drafter(COUNT_V, [7, 0, 0, 0])
  out = spec_generate(padded, COUNT_TABLE, drafter, [[3]], gamma=7, max_new_tokens=20)
  assert out.new_tokens == [[(4 + i) % COUNT_V for i in range(20)]]
  # 19 tokens after the first: 8 + 8 + 3 (cut), so 7 + 7 + 3 accepted, never more than
  # were committed (counting the cut block's 7 gave 21 for 20 new tokens).
  assert out.target_calls == [4] and out.accepted_tokens == [17]
  assert out.drafted_tokens == [17]
  assert out.steps == 3


# ------------------------------------------------------------ n-gram drafter

_PROPOSE = jax.jit(ngram_lib.propose_ngram, static_argnums=(2, 3, 4))


def propose(rows, lengths, gamma, max_n, min_n=1, num_slots=16):
  tokens = np.zeros((len(rows), num_slots), np.int32)
  for b, row in enumerate(rows):
    tokens[b, :len(row)] = row
  return np.asarray(_PROPOSE(jnp.asarray(tokens), jnp.asarray(lengths, jnp.int32), gamma,
                             max_n, min_n)[0]).tolist()


def test_ngram_latest_match_wins():
  assert propose([[5, 1, 7, 9, 1, 8, 9, 1]], [8], 5, 1) == [[8, 9, 1, 8, 9]]


def test_ngram_prefers_the_longer_match():
  ctx = [3, 1, 4, 2, 1, 5, 3, 1]
  assert propose([ctx], [8], 3, 2) == [[4, 2, 1]]    # 2-gram (3, 1) at 0
  assert propose([ctx], [8], 3, 1) == [[5, 3, 1]]    # 1-gram (1) latest at 4


def test_ngram_continuation_is_periodic():
  assert propose([[7, 8, 7, 8, 7]], [5], 5, 2) == [[8, 7, 8, 7, 8]]
  assert propose([[4, 4]], [2], 4, 3) == [[4, 4, 4, 4]]
  assert propose([[1, 2, 3, 1, 2, 3, 1]], [7], 7, 3) == [[2, 3, 1, 2, 3, 1, 2]]


def test_ngram_without_a_match_repeats_the_last_token():
  assert propose([[1, 2, 3]], [3], 4, 3) == [[3, 3, 3, 3]]
  assert propose([[6]], [1], 2, 1) == [[6, 6]]


def test_ngram_never_reads_past_a_rows_length():
  # Slots past each row's length hold stale tokens (rejected drafts, other data) that
  # would match and be copied if the length were ignored.
  rows = [[2, 5, 1, 2, 2, 8, 8, 8], [9, 3, 9, 3, 9, 3, 9, 9, 9, 9]]
  assert propose(rows, [4, 3], 4, 2) == [[5, 1, 2, 5], [3, 9, 3, 9]]


def reference_ngram(ctx, gamma, max_n, min_n):
  length = len(ctx)
  for n in range(max_n, min_n - 1, -1):
    if length < n + 1:
      continue
    suffix = ctx[length - n:]
    starts = [j for j in range(length - n) if ctx[j:j + n] == suffix]
    if starts:
      follow = starts[-1] + n
      return [ctx[follow + i % (length - follow)] for i in range(gamma)]
  return [ctx[-1]] * gamma


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@hypothesis.given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=16), min_size=3,
                           max_size=3),
                  hnp.arrays(np.int32, (3, 16), elements=st.integers(0, 3)))
def test_ngram_matches_a_brute_force_reference(rows, stale):
  tokens = stale.copy()
  for b, row in enumerate(rows):
    tokens[b, :len(row)] = row
  lengths = [len(r) for r in rows]
  got = np.asarray(_PROPOSE(jnp.asarray(tokens), jnp.asarray(lengths, jnp.int32), 5, 3,
                            1)[0]).tolist()
  assert got == [reference_ngram(r, 5, 3, 1) for r in rows]


# --------------------------------------------------------------- bad input

def _toy_generate(**kwargs):
  args = dict(gamma=2, max_new_tokens=4)
  args.update(kwargs)
  prompts = args.pop('prompts', [[1, 2]])
  return spec_generate(COUNT_TOY, COUNT_TABLE, NGRAM_TOY, prompts, **args)


@pytest.mark.parametrize('gamma', [0, -1, 2.5])
def test_gamma_must_be_a_positive_integer(gamma):
  with pytest.raises(ValueError, match=r'gamma must be an integer >= 1, got ' + str(gamma)):
    _toy_generate(gamma=gamma)


def test_gamma_too_large_for_the_cache():
  # 2 prompt tokens + 4 new + (40 + 1) verify slots = 47 > 32.
  with pytest.raises(ValueError, match=r'41 verify slots it needs 47 cache slots, more than '
                                       r'the 32 allowed'):
    _toy_generate(gamma=40, max_cache_len=32)
  _toy_generate(gamma=25, max_cache_len=32)   # 2 + 4 + 26 = 32 fits


def test_draft_model_with_another_vocabulary():
  with pytest.raises(ValueError, match=r'vocabulary \(8 tokens\).*\(16\)'):
    make_drafter('draft_model', target=COUNT_TOY,
                 draft_model=(toy_models.table_model(8), toy_models.count_up_table(8)))
  other = toy_models.right_for_k_drafter(8, [1])
  with pytest.raises(ValueError, match=r'vocabulary of 8 tokens but the target has 16'):
    spec_generate(COUNT_TOY, COUNT_TABLE, other, [[1]], gamma=2, max_new_tokens=4)


def test_unknown_drafter_name():
  with pytest.raises(ValueError, match=r"unknown drafter 'hydra'; known drafters: ngram, "
                                       r'draft_model, early_exit, layer_skip, medusa, eagle'):
    make_drafter('hydra', target=COUNT_TOY)


def test_draft_model_drafter_needs_a_model():
  with pytest.raises(ValueError, match='needs a draft model'):
    make_drafter('draft_model', target=COUNT_TOY)


def test_empty_prompt():
  with pytest.raises(ValueError, match='prompt 1 is empty'):
    _toy_generate(prompts=[[1, 2], []])
  with pytest.raises(ValueError, match='no prompts given'):
    _toy_generate(prompts=[])


@pytest.mark.parametrize('layers', [0, -1, 4, 5])
def test_early_exit_layers_out_of_range(layers):
  with pytest.raises(ValueError, match=rf'config.early_exit.layers must be .*got {layers}'):
    make_drafter('early_exit', target=TARGET, settings={'layers': layers})


def test_bad_ngram_sizes():
  with pytest.raises(ValueError, match=r'config.ngram.min_n / max_n need 1 <= min_n <= max_n, '
                     'got 3, 2'):
    make_drafter('ngram', target=COUNT_TOY, settings={'max_n': 2, 'min_n': 3})


def test_gamma_100_with_8_new_tokens_counts_only_what_was_committed():
  """Issue #10: a block of 100 right drafts cut at the 8-token budget once reported
  accepted_tokens=100. Drafts past the cut count as neither drafted nor accepted."""
  drafter = toy_models.right_for_k_drafter(COUNT_V, [100])
  out = spec_generate(COUNT_TOY, COUNT_TABLE, drafter, [[3]], gamma=100, max_new_tokens=8,
                      max_cache_len=256)
  assert out.new_tokens == [[(4 + i) % COUNT_V for i in range(8)]]
  assert out.target_calls == [2]                    # the prefill and one verify call
  assert out.accepted_tokens == [7] and out.drafted_tokens == [7]   # 7 committed after the first
  assert out.accepted_tokens[0] <= len(out.new_tokens[0]) - 1


def test_outcome_valued_policy_in_the_loop_is_exact():
  """The default batch valuation (over 64 outcomes) compiled into the loop at batch 4
  of mixed lengths: greedy output equals autoregressive, and with cheap calls it
  both drafts and takes plain steps."""
  buckets = draft_length.default_buckets(3)
  policy = draft_length.Policy(buckets, tuple(1.0 + 0.1 * n for n in buckets))
  assert policy.outcome_samples > 0
  out = speculative.generate(PADDED, TARGET_PARAMS, DRAFTERS['ngram'], PROMPTS, gamma=3,
                             max_new_tokens=MAX_NEW, eos_ids=(eos_id(),), policy=policy)
  assert out.new_tokens == greedy_reference()
  assert sum(out.drafted_tokens) > 0 and sum(out.plain_calls) > 0
