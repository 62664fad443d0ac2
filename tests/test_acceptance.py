"""The acceptance rules: exact in distribution, and their invariants.

Distribution tests run the whole speculative loop on toy bigram models (V = 6)
whose sequence distribution is computable from the tables, with 2**17 samples
each: one prompt repeated in one batch, each row its own rng stream. A
chi-square test must accept the library's rule and reject deliberately wrong
ones (negative controls), and the autoregressive sampler is checked against the
same exact distribution, so the reference itself is right.
"""

from __future__ import annotations


import hypothesis
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from specjax.decoding import acceptance
from specjax.decoding import autoregressive
from specjax import argmax as argmax_lib
from specjax import sampling as sampling_lib
from specjax.decoding import draft_length
from specjax.decoding import speculative
from specjax.drafters import make_drafter

import toy_models

SamplingConfig = sampling_lib.SamplingConfig

# ------------------------------------------------------------ exact reference

V = 6
NUM_NEW = 4                 # the first token, then at least one verify block
NUM_SAMPLES = 1 << 17
PROMPT = (3,)
NGRAM_PROMPT = (0, 3, 1, 3, 4, 3)   # same last token, so the same distribution
TARGET_TABLE = toy_models.random_table(V, seed=0, scale=1.5)
DRAFT_TABLE = toy_models.random_table(V, seed=1, scale=1.5)
TOY = toy_models.table_model(V)

P_VALUE_OK = 1e-3        # seeded, so deterministic; a correct rule fails 1 time in 1000 seeds
P_VALUE_WRONG = 1e-9

CONFIGS = {
    't1': SamplingConfig(temperature=1.0),
    't07': SamplingConfig(temperature=0.7),
    'topk': SamplingConfig(temperature=1.0, top_k=3),
    'topp': SamplingConfig(temperature=0.9, top_p=0.75),
    'topk_topp_t08': SamplingConfig(temperature=0.8, top_k=4, top_p=0.8),
}


def np_probabilities(logits_V: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
  """Temperature, then top-k, then top-p (the smallest most-likely set whose mass
  reaches top_p), written independently of the library in float64."""
  z = np.asarray(logits_V, np.float64) / cfg.temperature
  if 0 < cfg.top_k < z.size:
    z = np.where(z < np.sort(z)[-cfg.top_k], -np.inf, z)
  if cfg.top_p < 1.0:
    order = np.argsort(-z)
    probs = np.exp(z[order] - z[order[0]])
    probs /= probs.sum()
    cum = np.cumsum(probs)
    # No cumulative mass within float32 noise of top_p: both sides must agree.
    assert np.all(np.abs(cum - cfg.top_p) > 1e-4), 'pick another top_p for this table'
    num_kept = int(np.searchsorted(cum, cfg.top_p) + 1)  # first index reaching top_p, inclusive
    z = np.where(np.isin(np.arange(z.size), order[:num_kept]), z, -np.inf)
  p = np.exp(z - z.max())
  return p / p.sum()


def exact_sequence_probs(table: np.ndarray, last_token: int, cfg: SamplingConfig,
                         num_new: int) -> np.ndarray:
  """P(x_1..x_n) for a bigram target, flattened with x_1 most significant."""
  trans_VxV = np.stack([np_probabilities(row, cfg) for row in table])
  probs = trans_VxV[last_token]
  for _ in range(num_new - 1):
    last_of_each = np.arange(probs.size) % V
    probs = (probs[:, None] * trans_VxV[last_of_each]).reshape(-1)
  return probs


def sequence_counts(new_tokens: list[list[int]], num_new: int) -> np.ndarray:
  arr = np.asarray(new_tokens, np.int64)
  assert arr.shape == (len(new_tokens), num_new), 'every row must have exactly num_new tokens'
  codes = np.zeros(len(arr), np.int64)
  for i in range(num_new):
    codes = codes * V + arr[:, i]
  return np.bincount(codes, minlength=V ** num_new)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
  """(p-value, number of samples on impossible sequences). Cells expecting fewer
  than 5 samples are pooled into one."""
  n = counts.sum()
  impossible = int(counts[probs == 0].sum())
  expected = probs * n
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  exp = exp * obs.sum() / exp.sum()   # scipy wants equal totals to float precision
  return float(scipy.stats.chisquare(obs, exp).pvalue), impossible


def check_exact(new_tokens, cfg: SamplingConfig, *, last_token: int = PROMPT[-1],
                table: np.ndarray | None = None):
  """(p-value, samples on impossible sequences) against the exact distribution of the
  bigram `table` (default: this file's target).

  Chi-square on the first k tokens for every k (few cells see a small local
  difference, all cells see the whole joint), Bonferroni-corrected.
  """
  probs = exact_sequence_probs(TARGET_TABLE if table is None else table, last_token, cfg,
                               NUM_NEW)
  counts = sequence_counts(new_tokens, NUM_NEW)
  p_values, impossible = [], 0
  for k in range(1, NUM_NEW + 1):
    p_value, bad = chi_square(counts.reshape(V ** k, -1).sum(1), probs.reshape(V ** k, -1).sum(1))
    p_values.append(p_value)
    impossible = max(impossible, bad)
  return min(1.0, NUM_NEW * min(p_values)), impossible


def test_exact_sequence_probs_is_a_product_of_transitions():
  """The reference itself, by brute force on one sequence."""
  cfg = CONFIGS['topk_topp_t08']
  probs = exact_sequence_probs(TARGET_TABLE, 3, cfg, 3)
  trans = [np_probabilities(row, cfg) for row in TARGET_TABLE]
  for seq in [(0, 1, 2), (5, 5, 4), (2, 0, 3)]:
    want = trans[3][seq[0]] * trans[seq[0]][seq[1]] * trans[seq[1]][seq[2]]
    assert probs[seq[0] * V * V + seq[1] * V + seq[2]] == pytest.approx(want, rel=1e-12)
  assert probs.sum() == pytest.approx(1.0)
  assert (probs == 0).any()   # the filters leave impossible sequences to watch for


def test_np_probabilities_matches_the_library():
  for cfg in CONFIGS.values():
    got = np.asarray(sampling_lib.probabilities(jnp.asarray(TARGET_TABLE), cfg))
    want = np.stack([np_probabilities(row, cfg) for row in TARGET_TABLE])
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_array_equal(got == 0, want == 0)


# ------------------------------------------------------ full-loop distribution

DRAFT_MODEL = make_drafter('draft_model', target=TOY, draft_model=(TOY, DRAFT_TABLE))
NGRAM = make_drafter('ngram', target=TOY)
ARGMAX = toy_models.argmax_table_drafter(DRAFT_TABLE)


# Per extra position: 'cheap' calls make a free drafter's width follow its evidence;
# 'dear' ones make a costly drafter's width, chosen before it drafts, follow the
# batch's acceptance history (drafting pays near the prior's 0.5, not much below).
ADAPTIVE_COSTS = {'cheap': 0.01, 'dear': 0.27}


def run_speculative(drafter, cfg, gamma, *, prompt=PROMPT, seed=0, adaptive=False):
  """Fixed gamma, or the adaptive policy (`ADAPTIVE_COSTS`): rows then verify 0,
  the even counts below gamma or gamma drafts by their evidence and acceptance history."""
  if adaptive:
    buckets = draft_length.default_buckets(gamma)
    per = ADAPTIVE_COSTS[adaptive]
    policy = draft_length.Policy(buckets, tuple(1.0 + per * n for n in buckets))
  else:
    policy = draft_length.fixed(gamma)
  out = speculative.generate(TOY, TARGET_TABLE, drafter, [prompt] * NUM_SAMPLES, gamma=gamma,
                             max_new_tokens=NUM_NEW, sampling=cfg, seed=seed, policy=policy)
  return out


@pytest.mark.parametrize('config', ['t1', 't07', 'topk', 'topp'])
def test_autoregressive_sampler_is_exact(config):
  cfg = CONFIGS[config]
  out = autoregressive.generate(TOY, TARGET_TABLE, [PROMPT] * NUM_SAMPLES,
                                max_new_tokens=NUM_NEW, sampling=cfg, seed=11)
  p_value, impossible = check_exact(out.new_tokens, cfg)
  assert impossible == 0
  assert p_value > P_VALUE_OK, p_value


@pytest.mark.parametrize('drafter_name,config,gamma,adaptive', [
    ('draft_model', 't1', 2, False),   # full acceptance gives the bonus token at position 4
    ('draft_model', 't07', 3, False),  # the token budget ends mid-block
    ('draft_model', 'topk', 2, False),
    ('draft_model', 'topp', 1, False),
    ('ngram', 't1', 3, False),         # deterministic drafter: one-hot q
    ('argmax', 'topk_topp_t08', 2, False),
    # Adaptive draft length: rows verify 0 (a plain step), 2 or 3 / 4 drafts.
    ('draft_model', 't1', 3, 'dear'),
    ('ngram', 't1', 4, 'cheap'),
    ('draft_model', 'topp', 4, 'dear'),
])
def test_speculative_sampling_is_exact(drafter_name, config, gamma, adaptive):
  cfg = CONFIGS[config]
  drafter = {'draft_model': DRAFT_MODEL, 'ngram': NGRAM, 'argmax': ARGMAX}[drafter_name]
  prompt = NGRAM_PROMPT if drafter_name == 'ngram' else PROMPT
  out = run_speculative(drafter, cfg, gamma, prompt=prompt, seed=gamma, adaptive=adaptive)
  p_value, impossible = check_exact(out.new_tokens, cfg)
  assert impossible == 0
  assert p_value > P_VALUE_OK, p_value
  # The drafter must be neither always right nor always wrong, or the test is weak.
  rate = np.sum(out.accepted_tokens) / np.sum(out.drafted_tokens)
  assert 0.03 < rate < 0.95, rate
  if adaptive:   # plain steps and verify calls both happen
    plain = np.sum(out.plain_calls) / np.sum(np.asarray(out.target_calls) - 1)
    assert 0.02 < plain < 0.98, plain


# Deliberately wrong rules: modified copies of acceptance.speculative_sampling.

def _wrong_rule(*, accept_with_p=False, correction_from_p=False, bonus_at_previous=False,
                lockstep=False, accept_scale=1.0):

  def rule(draft_BxG, draft_probs_BxGxV, target_probs_BxG1xV, keys_B, num_drafts_B=None):
    batch, gamma = draft_BxG.shape
    vocab = target_probs_BxG1xV.shape[-1]
    p_draft_BxG = jnp.take_along_axis(target_probs_BxG1xV[:, :gamma], draft_BxG[..., None],
                                      axis=-1)[..., 0]
    if draft_probs_BxGxV is None:
      q_draft_BxG = jnp.ones_like(p_draft_BxG)
    else:
      q_draft_BxG = jnp.take_along_axis(draft_probs_BxGxV, draft_BxG[..., None], axis=-1)[..., 0]
    split = jax.vmap(jax.random.split)(keys_B)
    u_BxG = jax.vmap(lambda k: jax.random.uniform(k, (gamma,), jnp.float32))(split[:, 0])
    if accept_with_p:
      accept_BxG = u_BxG < p_draft_BxG                      # WRONG: ignores q
    else:
      accept_BxG = u_BxG * q_draft_BxG < p_draft_BxG * accept_scale   # WRONG unless 1
    num_accepted_B = acceptance.leading_accepts(accept_BxG)
    if lockstep:
      num_accepted_B = jnp.full_like(num_accepted_B, jnp.min(num_accepted_B))  # WRONG
    rows = jnp.arange(batch)
    rejected_B = num_accepted_B < gamma
    at_B = jnp.minimum(num_accepted_B, gamma - 1)
    position_B = num_accepted_B
    if bonus_at_previous:
      position_B = jnp.where(rejected_B, num_accepted_B, gamma - 1)   # WRONG: off by one
    p_next_BxV = target_probs_BxG1xV[rows, position_B]
    if draft_probs_BxGxV is None:
      q_next_BxV = jax.nn.one_hot(draft_BxG[rows, at_B], vocab, dtype=p_next_BxV.dtype)
    else:
      q_next_BxV = draft_probs_BxGxV[rows, at_B]
    q_next_BxV = jnp.where(rejected_B[:, None], q_next_BxV, 0.0)
    if correction_from_p:
      residual_BxV = p_next_BxV                                       # WRONG
    else:
      residual_BxV = jnp.maximum(p_next_BxV - q_next_BxV, 0.0)
    empty_B = jnp.sum(residual_BxV, axis=-1) <= 0.0
    residual_BxV = jnp.where(empty_B[:, None], p_next_BxV, residual_BxV)
    return num_accepted_B, sampling_lib.sample(split[:, 1], residual_BxV)

  return rule


# Fresh drafter objects force a new trace (the drafter is a static argument), so a
# patched rule never hits a program compiled with the real one, nor the reverse.
_NEGATIVE_DRAFTERS = []


def _fresh_draft_model():
  drafter = make_drafter('draft_model', target=TOY, draft_model=(TOY, DRAFT_TABLE))
  _NEGATIVE_DRAFTERS.append(drafter)
  return drafter


@pytest.mark.parametrize('wrong,threshold', [
    (dict(accept_with_p=True), P_VALUE_WRONG),
    (dict(correction_from_p=True), P_VALUE_WRONG),
    (dict(bonus_at_previous=True), P_VALUE_WRONG),
    (dict(lockstep=True), P_VALUE_WRONG),
    # Subtle: accepting 5% too often moves the (x1, x2) marginal by about 0.01 in
    # total variation; the test must still see it.
    (dict(accept_scale=1.05), P_VALUE_OK / 10),
], ids=['accept_with_p', 'correction_from_p', 'bonus_at_previous', 'lockstep',
        'accept_5pct_too_often'])
def test_distribution_test_rejects_a_wrong_rule(monkeypatch, wrong, threshold):
  """Negative control: the same statistic must reject a deliberately wrong rule."""
  cfg = CONFIGS['t1']
  monkeypatch.setattr(acceptance, 'speculative_sampling', _wrong_rule(**wrong))
  out = run_speculative(_fresh_draft_model(), cfg, 2, seed=2)
  p_value, impossible = check_exact(out.new_tokens, cfg)
  assert p_value < threshold or impossible > 0, p_value


def test_distribution_test_rejects_the_soft_q_of_an_argmax_drafter():
  """Negative control: an argmax drafter reporting its soft q (seen in two JAX projects)."""
  cfg = CONFIGS['topk_topp_t08']
  soft = toy_models.argmax_table_drafter(DRAFT_TABLE, soft_q=True)
  out = run_speculative(soft, cfg, 2, seed=2)
  p_value, impossible = check_exact(out.new_tokens, cfg)
  assert p_value < P_VALUE_WRONG or impossible > 0, p_value


def test_wrong_rule_is_really_patched_in(monkeypatch):
  """Guards the negative controls: the patched rule does reach the compiled loop."""
  calls = []

  def spy(*args):
    calls.append(1)
    return acceptance.greedy(args[0], jnp.argmax(args[2], axis=-1).astype(jnp.int32))

  monkeypatch.setattr(acceptance, 'speculative_sampling', spy)
  speculative.generate(TOY, TARGET_TABLE, _fresh_draft_model(), [PROMPT], gamma=2,
                       max_new_tokens=NUM_NEW, sampling=CONFIGS['t1'])
  assert calls


# ------------------------------------------------- one step of the rule, exactly

def _first_token_counts(rule, p_G1xV, q_GxV, drafts_NxG, seed):
  """The first token a verify step commits: draft 0 if accepted, else the correction."""
  n = drafts_NxG.shape[0]
  p = jnp.broadcast_to(jnp.asarray(p_G1xV), (n,) + p_G1xV.shape)
  q = None if q_GxV is None else jnp.broadcast_to(jnp.asarray(q_GxV), (n,) + q_GxV.shape)
  keys = sampling_lib.row_keys(seed, np.arange(n))
  num_accepted, next_token = jax.jit(rule)(jnp.asarray(drafts_NxG), q, p, keys)
  first = np.where(np.asarray(num_accepted) >= 1, drafts_NxG[:, 0], np.asarray(next_token))
  return np.bincount(first, minlength=V)


def _soft_case(seed):
  rng = np.random.default_rng(seed)
  p = np.stack([np_probabilities(rng.normal(size=V) * 1.5, CONFIGS['topk']) for _ in range(3)])
  q = np.stack([np_probabilities(rng.normal(size=V) * 1.5, CONFIGS['t1']) for _ in range(2)])
  drafts = np.stack([rng.choice(V, size=NUM_SAMPLES, p=q[i]) for i in range(2)], axis=1)
  return p.astype(np.float32), q.astype(np.float32), drafts.astype(np.int32)


def test_one_step_first_token_is_distributed_as_p():
  p, q, drafts = _soft_case(0)
  counts = _first_token_counts(acceptance.speculative_sampling, p, q, drafts, seed=1)
  p_value, impossible = chi_square(counts, p[0].astype(np.float64) / p[0].sum())
  assert impossible == 0 and p_value > P_VALUE_OK, p_value
  # Deterministic drafter: q is one-hot at a fixed draft.
  fixed = np.broadcast_to(np.array([[int(np.argmin(p[0])), 2]], np.int32), drafts.shape).copy()
  counts = _first_token_counts(acceptance.speculative_sampling, p, None, fixed, seed=2)
  p_value, impossible = chi_square(counts, p[0].astype(np.float64) / p[0].sum())
  assert impossible == 0 and p_value > P_VALUE_OK, p_value


def test_one_step_negative_control():
  p, q, drafts = _soft_case(0)
  for wrong in [dict(accept_with_p=True), dict(correction_from_p=True)]:
    counts = _first_token_counts(_wrong_rule(**wrong), p, q, drafts, seed=1)
    p_value, impossible = chi_square(counts, p[0].astype(np.float64) / p[0].sum())
    assert p_value < P_VALUE_WRONG or impossible > 0, (wrong, p_value)


# --------------------------------------------- the race never picks a zero weight

def test_sample_never_draws_a_zero_weight_even_when_the_race_has_a_zero(monkeypatch):
  """jax.random.exponential returns exactly 0.0 with probability 2**-23 per entry
  (it is -log1p(-u) with u on a 2**-23 grid including 0; e.g. key
  fold_in(key(0), 811753), shape (8,), entry 3). Then w / race is 0 / 0 = NaN for
  a zero weight, and argmax picks the NaN: an impossible token. Over Gemma's
  262k vocabulary with top-k, about 3% of draws would hit this."""
  # Every entry of both races (over the blocks' sums, then inside a block) exactly 0: a
  # zero weight's 0 / 0 is NaN everywhere, and only the mask keeps it from winning.
  monkeypatch.setattr(jax.random, 'exponential',
                      lambda key, shape, dtype=None: jnp.zeros(shape, jnp.float32))
  weights = jnp.asarray([[0.0, 0.3, 0.0, 0.5, 0.0, 0.0]], jnp.float32)
  token = int(sampling_lib.sample(sampling_lib.row_keys(0, [0]), weights)[0])
  assert weights[0, token] > 0, f'drew token {token}, whose weight is 0'


def test_sample_follows_its_weights():
  weights = np.array([0.0, 1.0, 0.0, 3.0, 0.5, 0.0], np.float32)
  keys = sampling_lib.row_keys(5, np.arange(NUM_SAMPLES))
  tokens = jax.jit(sampling_lib.sample)(keys, jnp.broadcast_to(weights, (NUM_SAMPLES, V)))
  p_value, impossible = chi_square(np.bincount(np.asarray(tokens), minlength=V),
                                   weights / weights.sum())
  assert impossible == 0 and p_value > P_VALUE_OK, p_value


def test_sample_over_blocks_follows_its_weights_with_extra_axes():
  """The two races over blocks (`sampling.sample`) on a vocabulary that is no multiple of
  the block (37 in blocks of 8: the last block padded), one row of 2 x 37 weights a key.
  Block 0 holds many small weights and block 1 one large one, so a block chosen by its
  largest weight instead of its sum (the negative control's distribution) is far off."""
  vocab = 37
  assert argmax_lib.chunk_size(vocab) == 8
  w = np.zeros(vocab, np.float32)
  w[0:8] = 0.5                  # block 0: sum 4, largest 0.5
  w[9] = 2.0                    # block 1: sum 2, largest 2
  w[17], w[36] = 0.25, 1.0      # block 2, and the padded last block
  weights_2xV = np.stack([w, w[::-1]])
  keys = sampling_lib.row_keys(11, np.arange(NUM_SAMPLES))
  tokens = np.asarray(jax.jit(sampling_lib.sample)(
      keys, jnp.broadcast_to(weights_2xV, (NUM_SAMPLES, 2, vocab))))
  assert tokens.shape == (NUM_SAMPLES, 2)
  for k in range(2):
    counts = np.bincount(tokens[:, k], minlength=vocab)
    p_value, impossible = chi_square(counts, weights_2xV[k] / weights_2xV[k].sum())
    assert impossible == 0 and p_value > P_VALUE_OK, (k, p_value)
  blocks = np.pad(w, (0, 3)).reshape(5, 8)
  by_max = blocks / blocks.sum(1, keepdims=True).clip(1e-30) * (blocks.max(1) / blocks.max(1).sum())[:, None]
  p_value, _ = chi_square(np.bincount(tokens[:, 0], minlength=vocab), by_max.ravel()[:vocab])
  assert p_value < 1e-6, p_value


# ---------------------------------------------------------- property tests

B, G = 4, 3
WEIGHTS = st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.3, 1.0, 3.0])
SETTINGS = hypothesis.settings(max_examples=150, deadline=None, derandomize=True)


def _normalise(w: np.ndarray) -> np.ndarray:
  w = np.array(w, np.float32)
  empty = w.sum(-1) == 0
  w[empty] = 1.0
  return w / w.sum(-1, keepdims=True)


@st.composite
def cases(draw, batch=B):
  p = _normalise(draw(hnp.arrays(np.float32, (batch, G + 1, V), elements=WEIGHTS)))
  q = _normalise(draw(hnp.arrays(np.float32, (batch, G, V), elements=WEIGHTS)))
  drafts = draw(hnp.arrays(np.int32, (batch, G), elements=st.integers(0, V - 1)))
  # A drafter only proposes tokens its q can produce.
  in_support = np.take_along_axis(q, drafts[..., None], -1)[..., 0] > 0
  drafts = np.where(in_support, drafts, np.argmax(q, -1)).astype(np.int32)
  seed = draw(st.integers(0, 2 ** 32 - 1))
  return p, q, drafts, seed


_RULE = jax.jit(acceptance.speculative_sampling)


@jax.jit
def _GREEDY(drafts, logits, num_drafts=None):  # pylint: disable=invalid-name
  """Greedy acceptance against logits, through their argmax as the loop gives it."""
  return acceptance.greedy(drafts, argmax_lib.argmax(logits), num_drafts)


def _run(p, q, drafts, seed, keys=None):
  keys = sampling_lib.row_keys(seed, np.arange(len(p))) if keys is None else keys
  n, nxt = _RULE(jnp.asarray(drafts), None if q is None else jnp.asarray(q), jnp.asarray(p),
                 keys)
  return np.asarray(n), np.asarray(nxt)


@SETTINGS
@hypothesis.given(cases())
def test_num_accepted_is_in_range(case):
  p, q, drafts, seed = case
  for q_arg in (q, None):
    n, nxt = _run(p, q_arg, drafts, seed)
    assert np.all((0 <= n) & (n <= G))
    assert np.all((0 <= nxt) & (nxt < V))
  n, nxt = _GREEDY(jnp.asarray(drafts), jnp.log(jnp.asarray(p) + 1e-30))
  assert np.all((0 <= np.asarray(n)) & (np.asarray(n) <= G))


@SETTINGS
@hypothesis.given(cases())
def test_q_equal_to_p_accepts_every_draft(case):
  p, _, _, seed = case
  q = p[:, :G]
  rng = np.random.default_rng(seed)
  drafts = np.array([[rng.choice(V, p=q[b, i] / q[b, i].sum()) for i in range(G)]
                     for b in range(len(p))], np.int32)
  n, nxt = _run(p, q, drafts, seed)
  np.testing.assert_array_equal(n, G)
  assert np.all(p[np.arange(len(p)), G, nxt] > 0)


@SETTINGS
@hypothesis.given(hnp.arrays(np.float32, (B, G + 1, V),
                             elements=st.floats(-4, 4, width=32, allow_subnormal=False)),
                  hnp.arrays(np.int32, (B,), elements=st.integers(0, G)))
def test_greedy_accepts_up_to_the_first_mismatch(logits, first_wrong):
  argmax = np.argmax(logits, -1)
  drafts = argmax[:, :G].copy()
  n, nxt = _GREEDY(jnp.asarray(drafts), jnp.asarray(logits))
  np.testing.assert_array_equal(np.asarray(n), G)
  np.testing.assert_array_equal(np.asarray(nxt), argmax[:, G])   # the bonus token
  for b, j in enumerate(first_wrong):
    if j < G:
      drafts[b, j] = (argmax[b, j] + 1) % V
  n, nxt = _GREEDY(jnp.asarray(drafts), jnp.asarray(logits))
  np.testing.assert_array_equal(np.asarray(n), first_wrong)
  np.testing.assert_array_equal(np.asarray(nxt), argmax[np.arange(B), first_wrong])


@SETTINGS
@hypothesis.given(cases())
def test_next_token_is_always_possible(case):
  p, q, drafts, seed = case
  rows = np.arange(B)
  for q_arg in (q, None):
    n, nxt = _run(p, q_arg, drafts, seed)
    assert np.all(p[rows, n, nxt] > 0), 'a token the target gives probability 0'
    q_full = (np.eye(V, dtype=np.float32)[drafts] if q_arg is None else q_arg)
    for b in rows[n < G]:
      residual = np.maximum(p[b, n[b]] - q_full[b, n[b]], 0)
      if residual.sum() > 0:
        assert residual[nxt[b]] > 0, 'a correction outside the residual max(0, p - q)'


@SETTINGS
@hypothesis.given(cases(batch=64))
def test_an_all_zero_residual_falls_back_to_p(case):
  """q >= p everywhere (here q = 2p, unnormalised): a rejection leaves max(0, p - q) = 0."""
  p, _, _, seed = case
  p = p.copy()
  p[..., 0] = 0.0           # where the unguarded race lands on an all-zero residual
  p[..., 1] += 0.1
  p /= p.sum(-1, keepdims=True)
  q = 2.0 * p[:, :G]
  rng = np.random.default_rng(seed)
  drafts = np.array([[rng.choice(V, p=p[b, i]) for i in range(G)] for b in range(len(p))],
                    np.int32)
  n, nxt = _run(p, q, drafts, seed)
  assert np.any(n < G)        # rejections happened: acceptance is 1/2 per draft
  assert np.all(p[np.arange(len(p)), n, nxt] > 0)


@SETTINGS
@hypothesis.given(cases())
def test_one_hot_q_path_equals_an_explicit_one_hot_q(case):
  p, _, drafts, seed = case
  got = _run(p, None, drafts, seed)
  want = _run(p, np.eye(V, dtype=np.float32)[drafts], drafts, seed)
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])


@SETTINGS
@hypothesis.given(cases(), cases(), st.integers(0, B - 1))
def test_rows_are_independent(case, other, row):
  p, q, drafts, seed = case
  keys = sampling_lib.row_keys(seed, np.arange(B))
  other_keys = sampling_lib.row_keys(other[3], np.arange(B))
  mixed = [np.array(o) for o in other[:3]]
  for m, x in zip(mixed, (p, q, drafts)):
    m[row] = x[row]
  mixed_keys = other_keys.at[row].set(keys[row])
  for use_q in (True, False):
    a = _run(p, q if use_q else None, drafts, seed, keys)
    b = _run(mixed[0], mixed[1] if use_q else None, mixed[2], seed, mixed_keys)
    assert a[0][row] == b[0][row] and a[1][row] == b[1][row]
  ga = _GREEDY(jnp.asarray(drafts), jnp.asarray(p))
  gb = _GREEDY(jnp.asarray(mixed[2]), jnp.asarray(mixed[0]))
  assert int(ga[0][row]) == int(gb[0][row]) and int(ga[1][row]) == int(gb[1][row])
