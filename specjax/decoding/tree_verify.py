"""One speculative step over a static token tree: propose, verify in one call, accept, compact.

The drafter fills the tree (`Drafter.propose_tree`; a drafter without one
fills a chain-shaped tree through its chain `propose`). The target verifies
the pending token and the N nodes in ONE forward pass: they are written at
consecutive cache slots L-1 .. L-1+N, at RoPE positions L-1 + depth, under the
tree's ancestor mask (`gemma.tree_attention_mask`). The acceptance rule
(`tree_acceptance.py`) picks each row's accepted root-to-node path; its
nodes' keys and values are then moved down to consecutive slots L .. L+a-1
in every layer (`kv_cache.compact`), so after the step the cache is exactly
what autoregressive decoding of the committed tokens would hold, and the
path's tokens plus the next token are committed as a chain's block is.

The tree is fixed: the adaptive draft-length policy does not apply. A step
where no live row has a valid node is one plain decode step instead.

Counters in tree mode: `drafted` counts the valid nodes each call verified
(the tree's width that had evidence, not its depth), `accepted` the accepted
path's nodes, both zero for a step cut before the path (EOS, budget);
`accepted_at` counts by depth. So accepted <= drafted, and accepted / calls
is the path length a tree buys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.decoding import prefill as prefill_lib
from specjax.decoding import tree_acceptance
from specjax.decoding.tree import Tree, TreeError
from specjax.drafters.base import Drafter, TargetView, TreeProposal
from specjax.models import kv_cache as kv_cache_lib

Array = jax.Array


def check_drafter(drafter: Drafter, tree: Tree) -> None:
  """Before anything is compiled: a drafter without `propose_tree` verifies chains only."""
  if drafter.propose_tree is None and not tree.is_chain:
    raise TreeError(f'drafter {drafter.name!r} does not propose branching trees (tree {tree}); '
                    f'give it a chain-<G> tree, or use a drafter that does (ngram)')


def propose(drafter: Drafter, tree: Tree, **kwargs) -> TreeProposal:
  """The drafter's tree, or its chain proposal laid out as a chain-shaped tree."""
  if drafter.propose_tree is not None:
    return drafter.propose_tree(tree=tree, **kwargs)
  check_drafter(drafter, tree)
  n = tree.num_nodes
  proposal = drafter.propose(gamma=n, **kwargs)
  valid_BxN = jnp.arange(n)[None, :] < jnp.clip(proposal.num_drafts_B, 0, n)[:, None]
  return TreeProposal(proposal.draft_BxG, proposal.q_BxGxV, valid_BxN, proposal.state,
                      proposal.shared_cache)


def _along_path(x, path_BxD1, axis: int):
  if x is None:
    return None
  index = path_BxD1.reshape((1,) * (axis - 1) + path_BxD1.shape + (1,) * (x.ndim - axis - 1))
  return jnp.take_along_axis(x, index, axis=axis)


def call(loop, tree: Tree, target_params, keys_B, max_new_B, decode: prefill_lib.DecodeState,
         proposal: TreeProposal, target_cache, accept_stream: int):
  """One tree verify call; returns what speculative._call does: the new decode
  state, the drafter's view, and per-row (drafted, accepted, path length, valid nodes)."""
  target, drafter = loop.target, loop.drafter
  batch = proposal.tokens_BxN.shape[0]
  rows = jnp.arange(batch)
  start_B = decode.lengths_B - 1
  pending_B = decode.tokens_BxS[rows, start_B]
  tokens_BxT = jnp.concatenate([pending_B[:, None], proposal.tokens_BxN], axis=1)
  depth_T = np.concatenate([[0], tree.depth_N]).astype(np.int32)
  positions_BxT = start_B[:, None] + jnp.asarray(depth_T)[None, :]
  out = target.forward(target_params, tokens_BxT, positions_BxT, target_cache,
                       hidden_layers=drafter.hidden_layers, tree_mask=jnp.asarray(tree.mask_TxT),
                       greedy=loop.sampling.greedy)
  valid_BxN = proposal.valid_BxN
  if loop.sampling.greedy:
    last_B, num_accepted_B, next_B = tree_acceptance.greedy(tree, proposal.tokens_BxN, valid_BxN,
                                                            out.argmax_BxR)
  else:
    keys = sampling_lib.step_keys(keys_B, decode.step + 1, accept_stream)
    p_BxTxV = sampling_lib.probabilities(out.logits_BxRxV, loop.sampling)
    last_B, num_accepted_B, next_B = tree_acceptance.sampling(
        tree, proposal.tokens_BxN, proposal.q_BxNxV, valid_BxN, p_BxTxV, keys)

  path_BxD1 = tree_acceptance.path_BxD1(tree, last_B)
  cache = kv_cache_lib.compact(out.cache, start_B, path_BxD1)
  d1 = path_BxD1.shape[1]
  block_BxD1 = jnp.take_along_axis(tokens_BxT, jnp.minimum(path_BxD1[:, 1:], tree.num_nodes),
                                   axis=1)
  block_BxD1 = jnp.concatenate([block_BxD1, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  block_BxD1 = block_BxD1.at[rows, num_accepted_B].set(next_B)
  new, count_B = prefill_lib.commit(decode, block_BxD1, num_accepted_B + 1, max_new_B,
                                    loop.eos_ids, cache)

  view = TargetView(tokens_BxS=new.tokens_BxS, lengths_B=new.lengths_B,
                    positions_BxT=start_B[:, None] + jnp.arange(d1)[None, :],
                    hidden_BxTxD=_along_path(out.hidden_BxTxD, path_BxD1, axis=1),
                    layer_hidden_LxBxTxD=_along_path(out.layer_hidden_LxBxTxD, path_BxD1, axis=2),
                    num_accepted_B=num_accepted_B,
                    num_verified_B=jnp.max(jnp.where(valid_BxN, jnp.asarray(tree.depth_N)[None, :],
                                                     0), axis=1).astype(jnp.int32))
  num_valid_B = jnp.sum(valid_BxN, axis=1).astype(jnp.int32)
  drafted_B = jnp.where(count_B > 0, num_valid_B, 0)
  accepted_B = jnp.minimum(num_accepted_B, count_B)
  return new, view, drafted_B, accepted_B, num_accepted_B, num_valid_B
