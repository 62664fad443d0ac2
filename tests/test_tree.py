"""Token trees: the tree itself, the tree-masked forward, KV compaction, greedy parity, bad input.

The tree-masked forward must give each node the logits a plain forward of its
root-to-node path gives (brute force, per path); after a tree step the KV cache
must be the one autoregressive decoding of the committed tokens writes; and
greedy tree decoding must equal greedy autoregressive decoding for every
drafter (chain-shaped trees for drafters that only draft chains), at batch 1
and at batch 4 of mixed lengths. Sampling is tested in test_tree_sampling.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling as sampling_lib
from specjax.decoding import autoregressive
from specjax.decoding import prefill as prefill_lib
from specjax.decoding import program as program_lib
from specjax.decoding import speculative
from specjax.decoding import tree as tree_lib
from specjax.decoding import tree_verify
from specjax.drafters import base
from specjax.drafters import candidate_tree
from specjax.drafters import draft_model as draft_model_lib
from specjax.drafters import make_drafter
from specjax.drafters import ngram as ngram_lib

import toy_models

TARGET, TARGET_PARAMS = toy_models.tiny_gemma()     # sliding window 6: trees cross it
DRAFT, DRAFT_PARAMS = toy_models.small_draft_gemma()
PADDED = toy_models.RowPadded(TARGET, data_parallelism=4)

BRANCHY = tree_lib.parse('-1,0,0,1,-1,4,2,6,7')   # depth 5, three leaves, two root children


# ------------------------------------------------------------------ the tree

def test_presets_and_parsing():
  assert tree_lib.parse('chain-3').parents == (-1, 0, 1)
  assert tree_lib.parse('chain-3').is_chain and not BRANCHY.is_chain
  assert tree_lib.parse(' -1, 0 ,0,1 ').parents == (-1, 0, 0, 1)
  medusa, eagle = tree_lib.parse('medusa-16'), tree_lib.parse('eagle-25')
  assert (medusa.num_nodes, medusa.max_depth) == (16, 5)
  assert (eagle.num_nodes, eagle.max_depth) == (25, 5)
  assert len(eagle.children[0]) == 4      # four candidates at the root
  assert tree_lib.from_choices([(0,), (1,), (0, 0)]).parents == (-1, -1, 0)


def test_depths_mask_and_paths_by_brute_force():
  for tree in [BRANCHY, tree_lib.parse('eagle-25'), tree_lib.parse('medusa-16')]:
    def ancestors(i):
      out = {i}
      while tree.parents[i] >= 0:
        i = tree.parents[i]
        out.add(i)
      return out
    for i in range(tree.num_nodes):
      assert tree.depth_N[i] == len(ancestors(i))
      expected = [True] + [j in ancestors(i) for j in range(tree.num_nodes)]
      assert tree.mask_TxT[i + 1].tolist() == expected
    assert tree.mask_TxT[0].tolist() == [True] + [False] * tree.num_nodes
    leaves = [i for i in range(tree.num_nodes) if i not in tree.parents]
    assert [p[-1] for p in tree.paths()] == leaves
    assert all(sorted(ancestors(p[-1])) == list(p) for p in tree.paths())


@pytest.mark.parametrize('spec,message', [
    ('0', r'tree node 0 has parent 0: a parent must be -1 \(the root\) \(node 0 has no earlier'),
    ('-1,1', r'tree node 1 has parent 1: .*earlier node \(0..0\).*rule out cycles'),   # a loop
    ('-1,2,1', r'tree node 1 has parent 2: .*earlier node \(0..0\)'),   # parent after child
    ('-1,-2', r'tree node 1 has parent -2'),
    ('eagle-99', r"unknown tree 'eagle-99': known presets are chain-<G>, medusa-16, eagle-25"),
    ('', r'a tree is a preset name or comma-separated parents'),
    ('chain-0', r'a chain needs at least one node'),
])
def test_bad_trees_are_refused(spec, message):
  with pytest.raises(tree_lib.TreeError, match=message):
    tree_lib.parse(spec)


def test_tree_refuses_non_integers():
  with pytest.raises(tree_lib.TreeError, match='parents must be integers'):
    tree_lib.Tree((-1, 0.5))
  with pytest.raises(tree_lib.TreeError, match='at least one node'):
    tree_lib.Tree(())


# ------------------------------------------------- the tree-masked forward

@functools.partial(jax.jit, static_argnames=('num_slots',))
def _forward_logits(tokens_BxT, positions_BxT, num_slots):
  cache = TARGET.init_cache(tokens_BxT.shape[0], num_slots)
  return TARGET.forward(TARGET_PARAMS, tokens_BxT, positions_BxT, cache).logits_BxRxV


@pytest.mark.parametrize('num_slots', [24, 64])   # local layers: the whole cache, a window slice
@pytest.mark.parametrize('per_row_mask', [False, True])
def test_tree_forward_gives_each_node_its_paths_chain_logits(num_slots, per_row_mask):
  """Each node's logits equal a plain forward of the root-to-node path as a chain,
  for rows whose committed lengths differ (so the window cuts them differently)."""
  tree, rng = BRANCHY, np.random.default_rng(0)
  lengths = [11, 4]
  batch = len(lengths)
  ctx = rng.integers(1, 64, size=(batch, max(lengths)))
  nodes_BxN = rng.integers(1, 64, size=(batch, tree.num_nodes))
  cache = TARGET.init_cache(batch, num_slots)
  prompt_len = max(lengths) - 1
  out = TARGET.forward(TARGET_PARAMS, jnp.asarray(ctx[:, :prompt_len]),
                       jnp.broadcast_to(jnp.arange(prompt_len), (batch, prompt_len)), cache)
  start = np.asarray(lengths) - 1
  tokens_BxT = np.concatenate([ctx[np.arange(batch), start][:, None], nodes_BxN], axis=1)
  positions_BxT = start[:, None] + np.concatenate([[0], tree.depth_N])[None, :]
  mask = jnp.asarray(tree.mask_TxT)
  if per_row_mask:
    mask = jnp.broadcast_to(mask, (batch,) + mask.shape)
  # A row's prefill past its length wrote stale entries; the tree call overwrites them.
  tree_out = TARGET.forward(TARGET_PARAMS, jnp.asarray(tokens_BxT), jnp.asarray(positions_BxT),
                            out.cache, tree_mask=mask)
  logits_BxTxV = np.asarray(tree_out.logits_BxRxV)
  for b, length in enumerate(lengths):
    for path in tree.paths():
      chain = np.concatenate([ctx[b, :length], nodes_BxN[b, list(path)]])
      ref_TxV = np.asarray(_forward_logits(jnp.asarray(chain[None]),
                                           jnp.arange(len(chain))[None], num_slots)[0])
      np.testing.assert_allclose(logits_BxTxV[b, 0], ref_TxV[length - 1], atol=1e-4)
      for k, node in enumerate(path):
        np.testing.assert_allclose(logits_BxTxV[b, node + 1], ref_TxV[length + k], atol=1e-4,
                                   err_msg=f'row {b} path {path} node {node}')


def test_a_wrong_mask_is_seen():
  """Guards the test above: a chain mask on a branching tree changes the logits."""
  tree, rng = BRANCHY, np.random.default_rng(1)
  ctx = rng.integers(1, 64, size=(1, 8))
  nodes = rng.integers(1, 64, size=(1, tree.num_nodes))
  cache = TARGET.init_cache(1, 32)
  out = TARGET.forward(TARGET_PARAMS, jnp.asarray(ctx[:, :7]), jnp.arange(7)[None], cache)
  tokens = jnp.asarray(np.concatenate([ctx[:, 7:], nodes], axis=1))
  positions = jnp.asarray(7 + np.concatenate([[0], tree.depth_N])[None])
  right = TARGET.forward(TARGET_PARAMS, tokens, positions, out.cache,
                         tree_mask=jnp.asarray(tree.mask_TxT)).logits_BxRxV
  wrong = TARGET.forward(TARGET_PARAMS, tokens, positions, out.cache,
                         tree_mask=jnp.tril(jnp.ones(tree.mask_TxT.shape, bool))).logits_BxRxV
  assert not np.allclose(right[0, 5:], wrong[0, 5:], atol=1e-3)   # node 4 is a second root child


# -------------------------------------------------------- the cache after a step

def test_kv_cache_after_a_tree_step_equals_autoregressive_decoding():
  """Rows accept different paths (the deep branch, a short one, none); afterwards every
  committed slot holds what a plain forward of the committed tokens writes."""
  tree = BRANCHY
  prompts = [(2, 5, 9, 11, 4, 7), (7, 3), (1, 60, 3, 8, 8)]
  batch, num_slots = len(prompts), 64
  greedy = [toy_models.reference_greedy(TARGET, TARGET_PARAMS, p, 7) for p in prompts]
  lengths = np.asarray([len(p) + 1 for p in prompts], np.int32)   # + the first new token
  tokens_BxS = np.zeros((batch, num_slots), np.int32)
  for b, p in enumerate(prompts):
    tokens_BxS[b, :len(p) + 1] = list(p) + greedy[b][:1]
  # Row 0 gets the target's continuation on the deep path 0-2-6-7-8; row 1 on the
  # short one 4-5; row 2 nothing right. Other nodes are wrong (the right token + 1).
  nodes = np.zeros((batch, tree.num_nodes), np.int32)
  for b, path in enumerate([(0, 2, 6, 7, 8), (4, 5), ()]):
    for i in range(tree.num_nodes):
      nodes[b, i] = (greedy[b][tree.depth_N[i]] + 1) % 64
    for k, node in enumerate(path):
      nodes[b, node] = greedy[b][k + 1]
  cache = TARGET.init_cache(batch, num_slots)
  prefill_len = int(lengths.max()) - 1
  out = TARGET.forward(TARGET_PARAMS, jnp.asarray(tokens_BxS[:, :prefill_len]),
                       jnp.broadcast_to(jnp.arange(prefill_len), (batch, prefill_len)), cache)
  decode = prefill_lib.DecodeState(jnp.asarray(tokens_BxS), jnp.asarray(lengths),
                                   jnp.ones((batch,), jnp.int32), jnp.zeros((batch,), bool),
                                   out.cache, jnp.int32(0))
  drafter = make_drafter('ngram', target=TARGET)
  loop = program_lib.Loop(target=TARGET, sampling=sampling_lib.SamplingConfig(), eos_ids=(),
                          prefill_len=prefill_len, drafter=drafter, gamma=tree.max_depth,
                          tree=tree)
  proposal = base.TreeProposal(jnp.asarray(nodes), None, jnp.ones(nodes.shape, bool), ())
  new, _, _, accepted_B, num_accepted_B, _ = tree_verify.call(
      loop, tree, TARGET_PARAMS, jnp.zeros((batch,), jnp.uint32), jnp.full((batch,), 20),
      decode, proposal, decode.cache, 1)
  assert num_accepted_B.tolist() == [5, 2, 0] and accepted_B.tolist() == [5, 2, 0]
  new_lengths = np.asarray(new.lengths_B)
  assert (new_lengths == lengths + [6, 3, 1]).all()
  for b in range(batch):
    committed = np.asarray(new.tokens_BxS[b, :new_lengths[b]])
    assert committed[len(prompts[b]):].tolist() == greedy[b][:new_lengths[b] - len(prompts[b])]
    ref = TARGET.forward(TARGET_PARAMS, jnp.asarray(committed[None]),
                         jnp.arange(len(committed))[None], TARGET.init_cache(1, num_slots)).cache
    cached = new_lengths[b] - 1   # the last committed token is pending, not yet in the cache
    for layer, (got, want) in enumerate(zip(new.cache, ref)):
      for kv in 'kv':
        np.testing.assert_allclose(np.asarray(got[kv][b, :cached]),
                                   np.asarray(want[kv][0, :cached]), atol=1e-5,
                                   err_msg=f'row {b} layer {layer} {kv}')


# -------------------------------------------------------------- greedy parity

PROMPTS = [(2, 5, 9, 11, 2, 5, 9, 3, 2, 5), (7,), tuple(range(30, 42)), (1, 60, 3, 1, 60)]
MAX_NEW = 20

DRAFTERS = {
    'ngram': make_drafter('ngram', target=TARGET),
    'draft_model': make_drafter('draft_model', target=TARGET, draft_model=(DRAFT, DRAFT_PARAMS)),
    'early_exit': make_drafter('early_exit', target=TARGET, settings={'layers': 2}),
    'self_draft': make_drafter('draft_model', target=TARGET, draft_model=(TARGET, TARGET_PARAMS)),
}


@functools.cache
def plain_greedy():
  return autoregressive.generate(TARGET, TARGET_PARAMS, PROMPTS, max_new_tokens=MAX_NEW).new_tokens


def tree_generate(drafter, tree, prompts=PROMPTS, target=PADDED, params=TARGET_PARAMS, **kwargs):
  return speculative.generate(target, params, drafter, prompts, gamma=tree.max_depth,
                              max_new_tokens=kwargs.pop('max_new_tokens', MAX_NEW), tree=tree,
                              **kwargs)


def check_counts(out, tree):
  for b, new in enumerate(out.new_tokens):
    calls = out.target_calls[b] - 1
    assert 0 <= out.accepted_tokens[b] <= out.drafted_tokens[b] <= tree.num_nodes * calls
    assert sum(out.accepted_at_position[b]) == out.accepted_tokens[b]
    assert out.accepted_tokens[b] <= len(new) - 1 <= out.accepted_tokens[b] + calls


@pytest.mark.parametrize('name,spec', [
    ('ngram', 'chain-4'), ('ngram', '-1,0,0,1,-1,4,2,6,7'), ('ngram', 'medusa-16'),
    ('ngram', 'eagle-25'), ('draft_model', 'chain-3'), ('draft_model', '-1,0,0,1,-1,4,2,6,7'),
    ('draft_model', 'eagle-25'), ('early_exit', 'chain-3'), ('self_draft', 'chain-4'),
    ('self_draft', 'eagle-25'),
])
def test_greedy_tree_decoding_equals_autoregressive(name, spec):
  tree = tree_lib.parse(spec)
  out = tree_generate(DRAFTERS[name], tree)
  assert out.new_tokens == plain_greedy()
  check_counts(out, tree)
  if name == 'self_draft':   # the target drafting for itself: every call but the cut last
    for calls, accepted in zip(out.target_calls, out.accepted_tokens):   # accepts it whole
      assert accepted >= (calls - 2) * tree.max_depth
  # batch 1, without row padding
  one = tree_generate(DRAFTERS[name], tree, prompts=[PROMPTS[0]], target=TARGET)
  assert one.new_tokens == plain_greedy()[:1]


def test_ngram_tree_branches_find_an_earlier_match_the_chain_misses():
  """Count-up target: after the pending 5 the latest earlier 5 was followed by 1 (wrong),
  an older one by 6, 7, 8 (right). The chain drafts the latest; the tree's second branch
  the older one, and its path is accepted whole."""
  model, table = toy_models.table_model(16), toy_models.count_up_table(16)
  prompt = (5, 6, 7, 8, 5, 1, 4)     # the first new token is 5
  ngram = make_drafter('ngram', target=model)
  chain = tree_generate(ngram, tree_lib.parse('chain-3'), prompts=[prompt], target=model,
                        params=table, max_new_tokens=5)
  tree = tree_generate(ngram, tree_lib.parse('-1,0,1,-1,3,4'), prompts=[prompt], target=model,
                       params=table, max_new_tokens=5)
  assert chain.new_tokens == tree.new_tokens == [[5, 6, 7, 8, 9]]
  assert tree.target_calls == [2] and tree.accepted_tokens == [3]
  assert chain.accepted_at_position[0][0] == 0 or chain.target_calls[0] > 2


COUNT_V = 16
TABLE = toy_models.random_table(COUNT_V, seed=6)
# The drafter's table is the target's, perturbed: its top choice is often not the target's.
RANKED = toy_models.ranked_table_tree_drafter(TABLE + toy_models.random_table(COUNT_V, seed=5))


@pytest.mark.parametrize('spec', ['eagle-25', '-1,-1,-1,0,0,1,3,3'])
def test_greedy_parity_on_a_table_target_with_a_top_k_tree_drafter(spec):
  """The right token sits at various ranks among a node's children."""
  table, model = TABLE, toy_models.table_model(COUNT_V)
  prompts = [(1, 2, 3), (4,), (5, 9, 9, 9, 9, 2), (15, 0)]
  ref = autoregressive.generate(model, table, prompts, max_new_tokens=MAX_NEW).new_tokens
  out = tree_generate(RANKED, tree_lib.parse(spec), prompts=prompts, target=model, params=table)
  assert out.new_tokens == ref
  # Only the drafter's first choices, as a chain of the same depth: fewer accepted.
  first = tree_generate(RANKED, tree_lib.chain(out.gamma), prompts=prompts, target=model,
                        params=table)
  assert first.new_tokens == ref
  assert sum(first.accepted_tokens) < sum(out.accepted_tokens)


@pytest.mark.parametrize('vocab', ['full', 'subset'])
def test_every_draft_model_node_is_its_rank_after_its_path(vocab):
  """After init, node i (its parent's r-th child) holds the r-th most likely token of
  the draft model run over the committed tokens and node i's path from scratch, over
  its draft vocabulary when it has one: the per-depth tree-masked passes see each
  node's ancestors and not its siblings or cousins, across the sliding window."""
  tree = BRANCHY
  ids_N = None if vocab == 'full' else np.arange(3, 64, 2, dtype=np.int32)
  drafter = draft_model_lib.make(DRAFT, DRAFT_PARAMS, vocab_ids_N=ids_N)
  rng = np.random.default_rng(4)
  prompt_len, slots = 9, 32
  tokens_BxS = jnp.asarray(rng.integers(3, 64, size=(2, slots)), jnp.int32)
  lengths_B = jnp.array([prompt_len + 1, prompt_len - 2], jnp.int32)   # + the pending token
  positions = jnp.broadcast_to(jnp.arange(prompt_len), (2, prompt_len))
  zeros = jnp.zeros((2, prompt_len, DRAFT.config.embed_dim))
  view = base.TargetView(tokens_BxS=tokens_BxS, lengths_B=lengths_B, positions_BxT=positions,
                         hidden_BxTxD=zeros, layer_hidden_LxBxTxD=None,
                         num_accepted_B=jnp.zeros((2,), jnp.int32),
                         num_verified_B=jnp.zeros((2,), jnp.int32))
  state = drafter.init(params=drafter.params, target=view)
  proposal = drafter.propose_tree(params=drafter.params, state=state, tokens_BxS=tokens_BxS,
                                  lengths_B=lengths_B, keys_B=None, sampling=None, tree=tree)
  tokens_BxN = np.asarray(proposal.tokens_BxN)
  assert np.asarray(proposal.valid_BxN).all()
  for b in range(2):
    committed = list(np.asarray(tokens_BxS[b, :int(lengths_B[b])]))
    for path in tree.paths():   # the path as a chain, padded after its end (causal)
      chain = committed + [int(tokens_BxN[b, n]) for n in path]
      chain += [0] * (slots - len(chain))
      logits_SxV = np.asarray(DRAFT.forward(
          DRAFT_PARAMS, jnp.asarray([chain], jnp.int32), jnp.arange(slots)[None],
          DRAFT.init_cache(1, slots)).logits_BxRxV[0])
      for k, i in enumerate(path):
        logits_V = logits_SxV[len(committed) - 1 + k]
        scored = logits_V if ids_N is None else logits_V[ids_N]
        want = np.sort(scored)[::-1][int(tree.child_rank_N[i])]
        assert logits_V[tokens_BxN[b, i]] == pytest.approx(want, abs=1e-4), (b, i)
        assert ids_N is None or tokens_BxN[b, i] in ids_N


def test_greedy_with_eos_and_budget_cuts():
  tree = tree_lib.parse('eagle-25')
  ref = plain_greedy()
  eos = ref[2][5]
  want = [r[:r.index(eos) + 1] if eos in r else r for r in ref]
  out = tree_generate(DRAFTERS['ngram'], tree, eos_ids=(eos,))
  assert out.new_tokens == want
  check_counts(out, tree)


# ------------------------------------------------------------------ n-gram trees

def test_ngram_tree_of_a_chain_is_the_chain_proposal():
  rng = np.random.default_rng(3)
  tokens = jnp.asarray(rng.integers(0, 4, size=(5, 32)), jnp.int32)
  lengths = jnp.asarray([32, 20, 3, 1, 9], jnp.int32)
  chain_BxG, matched_B = ngram_lib.propose_ngram(tokens, lengths, 6, 3, 1)
  cands, found = ngram_lib.candidates(tokens, lengths, 6, 3, 1, 4)
  nodes, valid = candidate_tree.fill(tree_lib.chain(6), cands, found)
  has = np.asarray(matched_B > 0)
  assert (np.asarray(valid).all(axis=1) == has).all() and (~np.asarray(valid)[~has]).all()
  assert (np.asarray(nodes)[has] == np.asarray(chain_BxG)[has]).all()


def test_candidate_tree_is_a_cropped_trie_with_distinct_siblings():
  cands = jnp.asarray([[[5, 1, 2], [5, 1, 3], [6, 0, 0], [5, 1, 2], [7, 7, 7]]], jnp.int32)
  found = jnp.asarray([[True, True, True, True, False]])
  tree = tree_lib.parse('-1,0,1,1,1,-1,5,-1')   # 5 -> 1 -> {2, 3, (none)}, 6 -> 0, (none)
  nodes, valid = candidate_tree.fill(tree, cands, found)
  assert np.asarray(valid)[0].tolist() == [True, True, True, True, False, True, True, False]
  assert np.asarray(nodes)[0, :4].tolist() == [5, 1, 2, 3]
  assert np.asarray(nodes)[0, 5:7].tolist() == [6, 0]


# ------------------------------------------------------------------ bad input

def test_branching_tree_with_a_chain_only_drafter_is_refused():
  with pytest.raises(tree_lib.TreeError, match=r"drafter 'early_exit' does not propose branching "
                                               r'trees \(tree -1,0,0'):
    tree_generate(DRAFTERS['early_exit'], tree_lib.parse('-1,0,0'))


def test_tree_more_nodes_than_the_cache_allows():
  # 10 prompt tokens + 20 new + (25 + 1) verify slots = 56 > 48.
  with pytest.raises(ValueError, match=r'26 verify slots it needs 56 cache slots, more than the '
                                       r'48 allowed'):
    tree_generate(DRAFTERS['ngram'], tree_lib.parse('eagle-25'), prompts=[PROMPTS[0]],
                  max_cache_len=48)


def test_gamma_must_be_the_tree_depth():
  with pytest.raises(ValueError, match=r'gamma=2 but the tree -1,0,1 is 3 deep'):
    speculative.generate(TARGET, TARGET_PARAMS, DRAFTERS['ngram'], PROMPTS, gamma=2,
                         max_new_tokens=4, tree=tree_lib.parse('chain-3'))
