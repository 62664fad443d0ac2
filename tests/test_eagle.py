"""The EAGLE drafter: its training-time test is what drafting computes, its drafts come
from the features and cache they should, greedy parity, exact sampling, bad weights.

Weights are random (scaled up so that drafts vary), so these tests check the
plumbing, not quality; test_training trains one.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decoding import draft_length
from specjax.decoding import speculative
from specjax.decoding import tree as tree_lib
from specjax.drafters import base
from specjax.drafters import eagle
from specjax.drafters import eagle_net
from specjax.models.config import tiny_config

import test_acceptance as acc
import toy_models
from test_speculative import MAX_NEW, PADDED, PROMPTS, TARGET, TARGET_PARAMS
from test_speculative import check_greedy_tree, eos_id, greedy_reference, spec_generate

CFG = TARGET.config
LAYERS = eagle_net.default_layers(CFG.num_layers)
SUBSET = np.arange(0, CFG.vocab_size, 2, dtype=np.int32)


def random_net(config, num_fused, seed, scale=1.0, params=None):
  net = eagle_net.init_params(config, num_fused, 48, jax.random.key(seed),
                              None if params is None else params['final_norm']['scale'])
  # Larger output projections than the near-identity initialisation: drafts that vary.
  return {k: v * scale if k in ('o_DxHE', 'down_DxF') else v for k, v in net.items()}


NET = random_net(CFG, len(LAYERS), seed=0, scale=10.0, params=TARGET_PARAMS)


def target_layers(tokens_BxL):
  """The target's residual stream at LAYERS over whole sequences: [L, B, T, D]."""
  b, length = tokens_BxL.shape
  positions = jnp.broadcast_to(jnp.arange(length), (b, length))
  out = TARGET.forward(TARGET_PARAMS, tokens_BxL, positions, TARGET.init_cache(b, length + 2),
                       hidden_layers=LAYERS)
  return out.layer_hidden_LxBxTxD


# ----------------------------------------------- training-time test == drafting

@pytest.mark.parametrize('window', [None, 6])
def test_the_training_time_test_computes_what_drafting_does(window):
  """unrolled(...)'s step j at chain t equals running the layer over positions 0..t with
  the target's features (one call, as init does), then j - 1 single-position steps on its
  own outputs through the cache, as propose does; with a window shorter than the
  context too."""
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, size=(2, 14)), jnp.int32)
  geo = eagle_net.Geometry.of(NET, CFG.rms_norm_eps, window)
  first = eagle_net.fuse(NET, target_layers(tokens))
  embedded = jnp.roll(eagle_net.embed(TARGET_PARAMS['embedding_VxD'], tokens), -1, axis=1)
  steps = 4
  outs = eagle_net.unrolled(NET, geo, first, embedded, steps)
  for t in (0, 5, 9):
    cache = eagle_net.init_cache(geo, 2, 20)
    positions = jnp.broadcast_to(jnp.arange(t + 1), (2, t + 1))
    out, cache = eagle_net.step(NET, geo, first[:, :t + 1], embedded[:, :t + 1], positions, cache)
    o = out[:, t]
    np.testing.assert_allclose(o, outs[0][:, t], rtol=1e-4, atol=1e-4)
    for j in range(1, steps):
      out, cache = eagle_net.step(NET, geo, o[:, None], embedded[:, t + j][:, None],
                                  jnp.full((2, 1), t + j), cache)
      o = out[:, 0]
      np.testing.assert_allclose(o, outs[j][:, t], rtol=1e-4, atol=1e-4, err_msg=f't={t} j={j}')
  # A step that ignored its own chain's earlier keys would differ: the check has teeth.
  assert not np.allclose(outs[2][:, 9], outs[1][:, 9], atol=1e-3)
  # So would one that ignored the window: at chain 9 a window of 6 hides positions 0..3.
  unlimited = eagle_net.unrolled(NET, dataclasses.replace(geo, window=None), first, embedded,
                                 steps)
  assert np.allclose(unlimited[1][:, 3], outs[1][:, 3], atol=1e-5)
  assert (window is None) == np.allclose(unlimited[1][:, 9], outs[1][:, 9], atol=1e-3)


REPLAY_LEN = 48


@functools.partial(jax.jit, static_argnames='steps')
def _replayed_logits(seq_1xL, chain, steps):
  """The training-time test's logits at one chain start, over the full vocabulary: [K, V]."""
  geo = eagle_net.Geometry.of(NET, CFG.rms_norm_eps)
  first = eagle_net.fuse(NET, target_layers(seq_1xL))
  embedded = jnp.roll(eagle_net.embed(TARGET_PARAMS['embedding_VxD'], seq_1xL), -1, axis=1)
  outs = eagle_net.unrolled(NET, geo, first, embedded, steps)
  at = jnp.stack([jax.lax.dynamic_slice_in_dim(o, chain, 1, axis=1)[0, 0] for o in outs])
  return eagle_net.logits(NET, TARGET_PARAMS['embedding_VxD'], at[None], CFG)[0]


def _recording(drafter: base.Drafter):
  seen = []

  def propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    jax.debug.callback(lambda *a: seen.append([np.asarray(x) for x in a]), proposal.draft_BxG,
                       kwargs['tokens_BxS'], kwargs['lengths_B'])
    return proposal

  return dataclasses.replace(drafter, propose=propose), seen


@pytest.mark.parametrize('adaptive', [False, True], ids=['fixed', 'adaptive'])
def test_every_draft_comes_from_the_target_features_of_the_committed_context(adaptive):
  """After prefill, verify calls with any accepted count and plain steps, each greedy
  draft is the argmax of the training-time test run on a full forward of the committed
  context plus the drafts before it: init and update index the right positions. The
  replay runs the trained float32 layer, so the drafter serves it unrounded."""
  drafter, seen = _recording(eagle.make(TARGET, NET, LAYERS, eagle.Settings(weights='float32'),
                                        target_params=TARGET_PARAMS))
  gamma = 3
  out = spec_generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=gamma,
                      max_new_tokens=MAX_NEW, eos_ids=(eos_id(),), adaptive=adaptive)
  assert out.new_tokens == greedy_reference()
  if adaptive:   # plain steps happen, and the drafts after them are checked too
    assert sum(out.plain_calls) > 0
  final_B = np.array([len(p) + len(new) for p, new in zip(PROMPTS, out.new_tokens)])
  checked = 0
  for draft_BxG, tokens_BxS, lengths_B in seen[:12]:   # prefill, then verify and plain calls
    for b in np.flatnonzero(lengths_B < final_B):
      n = int(lengths_B[b])
      seq = list(tokens_BxS[b, :n]) + list(draft_BxG[b])
      seq = jnp.asarray(seq + [0] * (REPLAY_LEN - len(seq)), jnp.int32)[None]  # causal: padding after is inert
      logits_GxV = np.asarray(_replayed_logits(seq, n - 2, gamma))
      for j in range(draft_BxG.shape[1]):   # adaptive: the width chosen before drafting
        assert logits_GxV[j, draft_BxG[b, j]] >= logits_GxV[j].max() - 1e-3, (n, j)
      checked += 1
  assert checked >= 10


# ------------------------------------------------------------ greedy parity

@pytest.mark.parametrize('vocab_ids,window', [(None, 0), (SUBSET, 0), (SUBSET, 16)],
                         ids=['full', 'reduced', 'reduced-window'])
@pytest.mark.parametrize('gamma', [1, 4])
def test_greedy_eagle_equals_greedy_autoregressive(gamma, vocab_ids, window):
  drafter = eagle.make(TARGET, NET, LAYERS, eagle.Settings(window=window), vocab_ids_N=vocab_ids,
                       target_params=TARGET_PARAMS)
  out = speculative.generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=gamma,
                             max_new_tokens=MAX_NEW, eos_ids=(eos_id(),),
                             policy=draft_length.fixed(gamma))
  assert out.new_tokens == greedy_reference()
  alone = speculative.generate(PADDED, TARGET_PARAMS, drafter, [PROMPTS[2]], gamma=gamma,
                               max_new_tokens=MAX_NEW, eos_ids=(eos_id(),),
                               policy=draft_length.fixed(gamma))
  assert alone.new_tokens == [greedy_reference()[2]]


def test_a_shorter_draft_vocabulary_drafts_only_its_first_ids_and_keeps_greedy_output():
  """eagle.draft_vocab_size scores the first N ids of the draft vocabulary: every
  draft is one of them (with all of SUBSET some are not), and the output is
  unchanged."""
  first = 8
  seen = {}
  for size in (0, first):
    drafter, drafts = _recording(eagle.make(
        TARGET, NET, LAYERS, eagle.Settings(draft_vocab_size=size), vocab_ids_N=SUBSET,
        target_params=TARGET_PARAMS))
    out = speculative.generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=3,
                               max_new_tokens=MAX_NEW, eos_ids=(eos_id(),),
                               policy=draft_length.fixed(3))
    assert out.new_tokens == greedy_reference()
    seen[size] = set(np.concatenate([d.ravel() for d, _, _ in drafts]).tolist())
  assert seen[first] <= set(SUBSET[:first].tolist())
  assert not seen[0] <= set(SUBSET[:first].tolist())


def test_the_draft_vocabulary_size_is_a_cap():
  """At most the first N ids: a larger N, 0, or a drafter over the full vocabulary
  scores all it has; a negative N is an error."""
  with pytest.raises(ValueError, match=r'draft_vocab_size must be >= 0'):
    eagle.Settings(draft_vocab_size=-1)
  served = lambda size, ids: eagle.make(  # noqa: E731
      TARGET, NET, LAYERS, eagle.Settings(draft_vocab_size=size), vocab_ids_N=ids,
      target_params=TARGET_PARAMS).params['ids_N']
  np.testing.assert_array_equal(served(5, SUBSET), SUBSET[:5])
  np.testing.assert_array_equal(served(9999, SUBSET), SUBSET)
  np.testing.assert_array_equal(served(0, SUBSET), SUBSET)
  assert served(5, None) is None


# ---------------------------------------------------- the int8 form of the layer

def test_the_int8_form_rounds_each_block_to_127_steps_of_its_largest_weight():
  rounded = eagle_net.with_int8_form(NET)
  forms = rounded[eagle_net.INT8]
  assert set(forms) == set(eagle_net.MATRICES)
  for name in eagle_net.MATRICES:
    w_OxI, q_OxI, scale_OxB = (np.asarray(NET[name]), np.asarray(forms[name][0]),
                               np.asarray(forms[name][1]))
    block = w_OxI.shape[1] // scale_OxB.shape[1]
    assert block == (32 if w_OxI.shape[1] % 32 == 0 else 16), name   # down_DxF is 48 wide
    assert q_OxI.dtype == np.int8
    scale_OxI = np.repeat(scale_OxB, block, axis=1)
    # The served matrix is exactly its int8 form, within half a step of the trained one.
    np.testing.assert_array_equal(np.asarray(rounded[name]), q_OxI * scale_OxI)
    assert np.all(np.abs(w_OxI - q_OxI * scale_OxI) <= scale_OxI / 2 * (1 + 1e-6)), name
    assert np.all(np.abs(q_OxI.reshape(-1, block)).max(axis=1) == 127), name
  for name in set(NET) - set(eagle_net.MATRICES):   # norms stay as trained
    np.testing.assert_array_equal(np.asarray(rounded[name]), np.asarray(NET[name]))


def test_the_int8_layer_computes_the_float32_layer_over_its_rounded_matrices():
  """The CPU kernel reads the int8 form; without it (another backend) the same rounded
  matrices are read in float32: one drafter everywhere."""
  rounded = eagle_net.with_int8_form(NET)
  as_float32 = {k: v for k, v in rounded.items() if k != eagle_net.INT8}
  geo = eagle_net.Geometry.of(NET)
  sequence = jnp.asarray([[3, 5, 7, 9, 11, 13]])
  features = target_layers(sequence[:, :5])
  tokens = sequence[:, 1:6]
  positions = jnp.arange(5)[None]
  for t in (1, 5):   # a decode-shaped call and a verify-shaped one
    hidden = eagle_net.fuse(rounded, features[:, :, :t])
    np.testing.assert_allclose(hidden, eagle_net.fuse(as_float32, features[:, :, :t]),
                               rtol=1e-5, atol=1e-5)
    embedded = eagle_net.embed(TARGET_PARAMS['embedding_VxD'], tokens[:, :t])
    out = [eagle_net.step(p, geo, hidden, embedded, positions[:, :t],
                          eagle_net.init_cache(geo, 1, 8))[0] for p in (rounded, as_float32)]
    np.testing.assert_allclose(out[0], out[1], rtol=1e-4, atol=1e-4)
  # ... and on CPU it is the int8 form that is read: doubled scales change the output.
  from specjax.cpu_kernels import q8_matmul  # pylint: disable=g-import-not-at-top
  if q8_matmul.applies(1, hidden):
    doubled = dict(rounded, **{eagle_net.INT8: {
        name: (q, 2 * scale) for name, (q, scale) in rounded[eagle_net.INT8].items()}})
    assert not np.allclose(eagle_net.fuse(doubled, features), eagle_net.fuse(rounded, features))


@pytest.mark.parametrize('gamma', [1, 4])
def test_greedy_eagle_with_int8_weights_equals_greedy_autoregressive(gamma):
  drafter = eagle.make(TARGET, NET, LAYERS, eagle.Settings(weights='int8'), vocab_ids_N=SUBSET,
                       target_params=TARGET_PARAMS)
  assert eagle_net.INT8 in drafter.params['net']
  out = speculative.generate(PADDED, TARGET_PARAMS, drafter, PROMPTS, gamma=gamma,
                             max_new_tokens=MAX_NEW, eos_ids=(eos_id(),),
                             policy=draft_length.fixed(gamma))
  assert out.new_tokens == greedy_reference()
  assert sum(out.accepted_tokens) > 0


# -------------------------------------------------- exact sampling (chi-square)

D = 4
# One narrow head: the drafter's own cache is batch x slots x heads x head_dim, and the
# chi-square runs 131,072 rows.
TOY = toy_models.HiddenBigram(tiny_config(vocab_size=acc.V, embed_dim=D, num_heads=1,
                                          num_kv_heads=1, head_dim=4))
_rng = np.random.default_rng(5)
TOY_PARAMS = {'hidden_VxD': jnp.asarray(_rng.normal(size=(acc.V, D)), jnp.float32),
              'embedding_VxD': jnp.asarray(_rng.normal(size=(acc.V, D)) * 0.8, jnp.float32),
              'final_norm': {'scale': jnp.ones((D,), jnp.float32)}}
TOY_TABLE = np.asarray(TOY_PARAMS['hidden_VxD'] @ TOY_PARAMS['embedding_VxD'].T)
TOY_LAYERS = (0, 2)
TOY_NET = random_net(TOY.config, len(TOY_LAYERS), seed=1, scale=3.0)


def _sample(drafter, cfg, gamma, seed):
  out = speculative.generate(TOY, TOY_PARAMS, drafter, [acc.PROMPT] * acc.NUM_SAMPLES,
                             gamma=gamma, policy=draft_length.fixed(gamma),
                             max_new_tokens=acc.NUM_NEW, sampling=cfg, seed=seed)
  p_value, impossible = acc.check_exact(out.new_tokens, cfg, table=TOY_TABLE)
  assert impossible == 0
  rate = np.sum(out.accepted_tokens) / np.sum(out.drafted_tokens)
  return p_value, rate


@pytest.mark.parametrize('config,vocab_ids', [
    ('t1', None),
    ('t1', np.array([0, 2, 3, 5], np.int32)),   # q is zero outside the draft vocabulary
])   # top-p and top-k draws are the shared sampling code's, tested with medusa and ngram
def test_eagle_sampling_is_exact(config, vocab_ids):
  drafter = eagle.make(TOY, TOY_NET, TOY_LAYERS, vocab_ids_N=vocab_ids, target_params=TOY_PARAMS)
  p_value, rate = _sample(drafter, acc.CONFIGS[config], gamma=3, seed=7)
  assert p_value > acc.P_VALUE_OK, p_value
  assert 0.03 < rate < 0.95, rate   # neither always right nor always wrong


def test_eagle_distribution_test_rejects_a_misaligned_q():
  drafter = eagle.make(TOY, TOY_NET, TOY_LAYERS, target_params=TOY_PARAMS)

  def propose(**kwargs):
    proposal = drafter.propose(**kwargs)
    return proposal.replace(q_BxGxV=jnp.roll(proposal.q_BxGxV, 1, axis=1))

  p_value, _ = _sample(dataclasses.replace(drafter, propose=propose), acc.CONFIGS['t1'],
                       gamma=3, seed=7)
  assert p_value < acc.P_VALUE_WRONG, p_value


# ------------------------------------------------------------------ trees

BRANCHING = '-1,-1,-1,0,0,1,3,4'   # 3 at depth 1, runners-up at depths 2 to 4


@pytest.mark.parametrize('spec', [BRANCHING, 'eagle-25'])
def test_greedy_eagle_trees_equal_greedy_autoregressive(spec):
  drafter = eagle.make(TARGET, NET, LAYERS, vocab_ids_N=SUBSET, target_params=TARGET_PARAMS)
  _, chain = check_greedy_tree(drafter, tree_lib.parse(spec))
  assert sum(chain.accepted_tokens) > 0


def _prefilled(seed: int, lengths: list[int], prompt_len: int = 19, slots: int = 34):
  """Random prompts (padded to prompt_len) of the given lengths (the pending token
  included) and the view the loop hands `init` after the target's prefill."""
  rng = np.random.default_rng(seed)
  batch = len(lengths)
  tokens_BxS = jnp.asarray(rng.integers(3, CFG.vocab_size, size=(batch, slots)), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(prompt_len), (batch, prompt_len))
  out = TARGET.forward(TARGET_PARAMS, tokens_BxS[:, :prompt_len], positions,
                       TARGET.init_cache(batch, slots), hidden_layers=LAYERS)
  zeros_B = jnp.zeros((batch,), jnp.int32)
  return base.TargetView(tokens_BxS=tokens_BxS, lengths_B=jnp.asarray(lengths, jnp.int32),
                         positions_BxT=positions, hidden_BxTxD=out.hidden_BxTxD,
                         layer_hidden_LxBxTxD=out.layer_hidden_LxBxTxD,
                         num_accepted_B=zeros_B, num_verified_B=zeros_B)


@pytest.mark.parametrize('window', [0, 16], ids=['no-window', 'window'])
def test_init_runs_the_layer_at_the_last_prompt_position_as_over_the_whole_prompt(window):
  """init writes every prompt position's keys and keeps each row's last position's
  inputs, from which drafting runs the rest of the layer there; that output and the
  cache up to there equal the layer run over the whole prompt (rows of different
  lengths, padding after them)."""
  drafter = eagle.make(TARGET, NET, LAYERS, eagle.Settings(window=window),
                       target_params=TARGET_PARAMS)
  prompt_len, slots = 19, 34
  view = _prefilled(5, [prompt_len + 1, 7, 12], prompt_len, slots)
  state = drafter.init(params=drafter.params, target=view, target_params=TARGET_PARAMS)
  geo = eagle_net.Geometry.of(NET, CFG.rms_norm_eps, window or None)
  net = drafter.params['net']
  nxt = jnp.take_along_axis(view.tokens_BxS, view.positions_BxT + 1, axis=1)
  full_BxTxD, full_cache = eagle_net.step(
      net, geo, eagle_net.fuse(net, view.layer_hidden_LxBxTxD),
      eagle_net.embed(TARGET_PARAMS['embedding_VxD'], nxt), view.positions_BxT,
      eagle_net.init_cache(geo, 3, slots + 2), key_slots=prompt_len)
  last_B = np.asarray(view.lengths_B) - 2
  for name in ('k', 'v'):   # the committed slots; later ones are hidden until rewritten
    for b in range(3):
      np.testing.assert_allclose(state['cache'][name][b, :last_B[b] + 1],
                                 full_cache[name][b, :last_B[b] + 1], rtol=1e-5, atol=1e-5)
  first_BxD = _first_output(net, state, geo, view.lengths_B)
  np.testing.assert_allclose(first_BxD, np.asarray(full_BxTxD)[np.arange(3), last_B],
                             rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(first_BxD).max()) > 0.1


def _first_output(net, state, geo, lengths_B):
  """The layer's output at lengths - 2, from the inputs init or update kept."""
  out_Bx1xD, _ = eagle_net.step(net, geo, state['hidden_BxD'][:, None],
                                state['embedded_BxD'][:, None], (lengths_B - 2)[:, None],
                                state['cache'])
  return out_Bx1xD[:, 0]


@pytest.mark.parametrize('window', [0, 16])
def test_every_tree_node_is_its_rank_after_its_path_drafted_as_a_chain(window):
  """After a prefill, node i (its parent's r-th child) holds the r-th most likely
  token of the layer run along node i's path as a chain (`eagle_net.step` through a
  copy of the cache, as `propose` would draft those tokens): the tree's attention
  sees each node's ancestors and not its siblings or cousins, and, with a window
  shorter than the context, the same committed keys as a chain step."""
  tree = tree_lib.parse(BRANCHING)
  drafter = eagle.make(TARGET, NET, LAYERS, eagle.Settings(window=window),
                       target_params=TARGET_PARAMS)
  view = _prefilled(3, [20, 20])   # 19 prompt positions and the pending token
  tokens_BxS, lengths_B = view.tokens_BxS, view.lengths_B
  state = drafter.init(params=drafter.params, target=view, target_params=TARGET_PARAMS)
  proposal = drafter.propose_tree(params=drafter.params, state=state, tokens_BxS=tokens_BxS,
                                  lengths_B=lengths_B, keys_B=None, sampling=None, tree=tree,
                                  target_params=TARGET_PARAMS)
  tokens_BxN = np.asarray(proposal.tokens_BxN)
  assert np.asarray(proposal.valid_BxN).all()
  geo = eagle_net.Geometry.of(NET, CFG.rms_norm_eps, window or None)
  net = drafter.params['net']
  for path in tree.paths():
    o, cache = _first_output(net, state, geo, lengths_B), state['cache']
    for d, node in enumerate(path, start=1):
      logits_BxV = np.asarray(eagle_net.logits(net, TARGET_PARAMS['embedding_VxD'], o[:, None],
                                               CFG, geo.eps)[:, 0])
      rank = int(tree.child_rank_N[node])
      for b in range(2):
        want = np.sort(logits_BxV[b])[::-1][rank]
        assert logits_BxV[b, tokens_BxN[b, node]] == pytest.approx(want, abs=1e-4), (path, d)
      embedded = eagle_net.embed(TARGET_PARAMS['embedding_VxD'],
                                 jnp.asarray(tokens_BxN[:, node])[:, None])
      o, cache = eagle_net.step(net, geo, o[:, None], embedded,
                                (lengths_B - 2 + d)[:, None], cache)
      o = o[:, 0]
  # Siblings differ, and a node's children are drafted after it, not after a sibling.
  assert (tokens_BxN[:, 0] != tokens_BxN[:, 1]).all()


def test_eagle_tree_sampling_is_exact():
  tree = tree_lib.parse('-1,-1,0,0,1,2')
  drafter = eagle.make(TOY, TOY_NET, TOY_LAYERS, target_params=TOY_PARAMS)
  cfg = acc.CONFIGS['t1']
  out = speculative.generate(TOY, TOY_PARAMS, drafter, [acc.PROMPT] * acc.NUM_SAMPLES,
                             gamma=tree.max_depth, max_new_tokens=acc.NUM_NEW, sampling=cfg,
                             seed=9, tree=tree)
  p_value, impossible = acc.check_exact(out.new_tokens, cfg, table=TOY_TABLE)
  assert impossible == 0 and p_value > acc.P_VALUE_OK, p_value
  assert 0 < sum(out.accepted_tokens) < sum(out.drafted_tokens)


# ------------------------------------------------------------------ bad input

def test_weights_for_another_target_or_bad_layers_are_errors():
  other = random_net(dataclasses.replace(CFG, embed_dim=16), len(LAYERS), seed=0)
  with pytest.raises(ValueError, match='eagle weights do not fit this target.*fuse_DxLD'):
    eagle.make(TARGET, other, LAYERS, target_params=TARGET_PARAMS)
  with pytest.raises(ValueError, match='eagle weights do not fit this target'):
    eagle.make(TARGET, NET, LAYERS[:1], target_params=TARGET_PARAMS)   # 1 layer, weights for 2
  with pytest.raises(ValueError, match=r'reads target layers \[9\]'):
    eagle.make(TARGET, NET, (0, 9), target_params=TARGET_PARAMS)
  with pytest.raises(ValueError, match='needs the target params'):
    eagle.make(TARGET, NET, LAYERS)
  with pytest.raises(ValueError, match='draft vocabulary must be ids'):
    eagle.make(TARGET, NET, LAYERS, vocab_ids_N=np.array([CFG.vocab_size]),
               target_params=TARGET_PARAMS)
  with pytest.raises(ValueError, match=r'window must be -1 \(the trained length\), 0 \(none\) or '
                                       r'>= 16, got 8'):
    eagle.Settings(window=8)
  with pytest.raises(ValueError, match="weights must be one of float32, int8, got 'int4'"):
    eagle.Settings(weights='int4')
  with pytest.raises(ValueError, match='trained on sequences of 12 tokens.*eagle.window'):
    eagle.make(TARGET, NET, LAYERS, target_params=TARGET_PARAMS, trained_length=12)


def test_the_window_defaults_to_the_length_the_checkpoint_was_trained_on(tmp_path):
  from specjax import drafters  # pylint: disable=g-import-not-at-top
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  signature = drafter_io.target_signature(CFG, '')
  drafter_io.save_drafter(tmp_path, 'eagle', NET, target=signature,
                          provenance={'hidden_layers': list(LAYERS),
                                      'data_recipe': {'seq_len': 24}})
  trained = drafter_io.load_drafter(tmp_path, 'eagle', target=signature)
  geometry = {}
  real = eagle_net.Geometry.of
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(eagle_net.Geometry, 'of', lambda *a: geometry.setdefault('geo', real(*a)))
    drafters.make_drafter('eagle', target=TARGET, trained=trained, target_params=TARGET_PARAMS)
    assert geometry.pop('geo').window == 24
    drafters.make_drafter('eagle', target=TARGET, trained=trained, target_params=TARGET_PARAMS,
                          settings=eagle.Settings(window=0))
    assert geometry.pop('geo').window is None
