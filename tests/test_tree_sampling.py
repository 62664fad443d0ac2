"""Token-tree sampling is exact: chi-square against the target's own distribution.

The machinery of test_acceptance.py (bigram target, V = 6, 2**17 rows, the exact
sequence distribution, Bonferroni over prefixes) checks the multi-candidate rule
(tree_acceptance.sampling) for distinct deterministic siblings (a top-k tree and
n-gram trees, a draft model's ranked tree), identical siblings, i.i.d. sampled
siblings (SpecInfer), and a chain-only drafter (a draft model's sampled chain)
through a chain-shaped tree; negative controls are rules that
forget to renormalise, to remove rejected siblings, or to subtract q, which the same test
must reject. (Treating sampled siblings as deterministic ones, q ignored, is
no negative control: "accept x with r'(x), then remove x" is exact for drafts
chosen in any way independent of the target's draw, only less often accepted.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling as sampling_lib
from specjax.decoding import speculative
from specjax.decoding import tree as tree_lib
from specjax.decoding import tree_acceptance

import test_acceptance as ta
import toy_models

TREE = tree_lib.parse('-1,-1,-1,0,0,1,3')   # three root candidates, depth 3
RANKED = toy_models.ranked_table_tree_drafter(ta.DRAFT_TABLE)
SAMPLED = toy_models.sampled_table_tree_drafter(ta.DRAFT_TABLE)
DUPLICATE = toy_models.ranked_table_tree_drafter(ta.DRAFT_TABLE, duplicate=True)
# The draft model's chains alone: draws from q, laid out as a chain-shaped tree.
CHAIN_ONLY = dataclasses.replace(ta.DRAFT_MODEL, propose_tree=None)


def run_tree(drafter, cfg, tree=TREE, *, prompt=ta.PROMPT, seed=0):
  return speculative.generate(ta.TOY, ta.TARGET_TABLE, drafter, [prompt] * ta.NUM_SAMPLES,
                              gamma=tree.max_depth, max_new_tokens=ta.NUM_NEW, sampling=cfg,
                              seed=seed, tree=tree)


@pytest.mark.parametrize('drafter_name,config,tree', [
    ('ranked', 't1', TREE),
    ('ranked', 'topp', TREE),
    ('duplicate', 't1', TREE),
    ('sampled', 't1', TREE),
    ('sampled', 'topp', TREE),
    ('ngram', 't1', 'eagle-25'),
    ('draft_model', 't1', TREE),
    ('draft_model', 'topp', TREE),
    ('chain_only', 't1', 'chain-3'),
])
def test_tree_sampling_is_exact(drafter_name, config, tree):
  cfg = ta.CONFIGS[config]
  tree = tree_lib.parse(tree) if isinstance(tree, str) else tree
  drafter = {'ranked': RANKED, 'duplicate': DUPLICATE, 'sampled': SAMPLED,
             'ngram': ta.NGRAM, 'draft_model': ta.DRAFT_MODEL, 'chain_only': CHAIN_ONLY
             }[drafter_name]
  prompt = ta.NGRAM_PROMPT if drafter_name == 'ngram' else ta.PROMPT
  out = run_tree(drafter, cfg, tree, prompt=prompt, seed=7)
  p_value, impossible = ta.check_exact(out.new_tokens, cfg)
  assert impossible == 0
  assert p_value > ta.P_VALUE_OK, p_value
  # Accepted paths per call: neither none nor all, or the test is weak.
  per_call = np.sum(out.accepted_tokens) / np.sum(np.asarray(out.target_calls) - 1)
  assert 0.1 < per_call < tree.max_depth - 0.1, per_call


# Deliberately wrong rules: modified copies of tree_acceptance.sampling.

def _wrong_rule(*, no_renormalise=False, keep_rejected=False, one_hot_residual=False):

  def rule(tree, tokens_BxN, q_BxNxV, valid_BxN, p_BxTxV, keys_B):
    batch, vocab = p_BxTxV.shape[0], p_BxTxV.shape[-1]
    rows = jnp.arange(batch)
    children_TxK = jnp.asarray(tree_acceptance._children_TxK(tree))
    depth_T = jnp.asarray(np.concatenate([[0], tree.depth_N]).astype(np.int32))
    num_kids = children_TxK.shape[1]
    cur_B = jnp.zeros((batch,), jnp.int32)
    done_B = jnp.zeros((batch,), bool)
    next_B = jnp.zeros((batch,), jnp.int32)
    r_BxV = p_BxTxV[:, 0]
    for level in range(tree.max_depth + 1):
      moved_B = jnp.zeros((batch,), bool)
      for c in range(num_kids):
        node_B = children_TxK[cur_B, c]
        at_B = jnp.maximum(node_B, 0)
        tries_B = (node_B >= 0) & ~done_B & ~moved_B & valid_BxN[rows, at_B]
        x_B = tokens_BxN[rows, at_B]
        total_B = jnp.sum(r_BxV, axis=-1)
        if no_renormalise:
          total_B = jnp.ones_like(total_B)                            # WRONG
        rx_B = r_BxV[rows, x_B]
        q_node_BxV = (jax.nn.one_hot(x_B, vocab, dtype=r_BxV.dtype) if q_BxNxV is None
                      else q_BxNxV[rows, at_B])
        qx_B = q_node_BxV[rows, x_B]
        u_B = jax.vmap(lambda k: jax.random.uniform(
            jax.random.fold_in(k, level * num_kids + c)))(keys_B)
        accept_B = tries_B & (u_B * qx_B * total_B < rx_B)
        rejected_B = tries_B & ~accept_B
        residual_BxV = jnp.maximum(r_BxV / jnp.maximum(jnp.sum(r_BxV, -1), 1e-30)[:, None]
                                   - q_node_BxV, 0.0)
        if keep_rejected:
          residual_BxV = r_BxV                                        # WRONG
        if one_hot_residual:                                          # WRONG with a soft q
          residual_BxV = jnp.where(jnp.arange(vocab)[None] == x_B[:, None], 0.0, r_BxV)
        r_BxV = jnp.where(rejected_B[:, None], residual_BxV, r_BxV)
        r_BxV = jnp.where(accept_B[:, None], p_BxTxV[rows, at_B + 1], r_BxV)
        cur_B = jnp.where(accept_B, node_B + 1, cur_B)
        moved_B |= accept_B
      stop_B = ~done_B & ~moved_B
      empty_B = jnp.sum(r_BxV, axis=-1) <= 0.0
      r_draw_BxV = jnp.where(empty_B[:, None], p_BxTxV[rows, cur_B], r_BxV)
      draw_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1_000_003 + level))(keys_B)
      next_B = jnp.where(stop_B, sampling_lib.sample(draw_keys, r_draw_BxV), next_B)
      done_B |= stop_B
    return cur_B, depth_T[cur_B], next_B

  return rule


@pytest.mark.parametrize('wrong,make', [
    (dict(no_renormalise=True), lambda: toy_models.ranked_table_tree_drafter(ta.DRAFT_TABLE)),
    (dict(keep_rejected=True), lambda: toy_models.ranked_table_tree_drafter(ta.DRAFT_TABLE)),
    (dict(one_hot_residual=True),
     lambda: toy_models.sampled_table_tree_drafter(ta.DRAFT_TABLE)),
], ids=['no_renormalise', 'keep_rejected', 'one_hot_residual'])
def test_distribution_test_rejects_a_wrong_tree_rule(monkeypatch, wrong, make):
  """Negative control; a fresh drafter forces a new trace with the patched rule."""
  cfg = ta.CONFIGS['t1']
  monkeypatch.setattr(tree_acceptance, 'sampling', _wrong_rule(**wrong))
  out = run_tree(make(), cfg, seed=7)
  p_value, impossible = ta.check_exact(out.new_tokens, cfg)
  assert p_value < ta.P_VALUE_WRONG or impossible > 0, p_value


def test_the_copied_rule_unmodified_passes(monkeypatch):
  """Guards the negative controls: the copy differs from the library only by its flags."""
  cfg = ta.CONFIGS['t1']
  monkeypatch.setattr(tree_acceptance, 'sampling', _wrong_rule())
  out = run_tree(toy_models.ranked_table_tree_drafter(ta.DRAFT_TABLE), cfg, seed=7)
  p_value, impossible = ta.check_exact(out.new_tokens, cfg)
  assert impossible == 0 and p_value > ta.P_VALUE_OK, p_value
