"""Acceptance over a token tree: the longest valid path, and the token after it.

Alignment as in `acceptance.py`: `logits_BxTxV[:, t]` is the target's
prediction after tree index t (0 the root, i + 1 node i), so node i is scored
by its parent's row and the token after the accepted path comes from its last
node's row. Both rules return, per row, the tree index of the path's last
node (0: nothing accepted), the path length, and the next token. A node that
is not valid (`valid_BxN`, the drafter's evidence, fixed before the target
ran) is never accepted and never counts as a rejection.

Greedy: a node is accepted when its token is the target's argmax after its
parent and its parent was accepted; the deepest accepted node wins (the first
on ties), and the next token is the argmax after it.

Sampling: the exact multi-candidate rule (SpecInfer, Miao et al. 2024;
EAGLE's `evaluate_posterior`): from the root, with r = p at the current node,
try its children in order; child x is accepted with probability
min(1, r'(x) / q(x)) with r' = r / sum(r), and on its rejection
r <- max(0, r' - q). After an acceptance, move to that child with r = p
there; when every child was rejected (or there is none), draw the next token
from r (from p if r is all zero). A deterministic drafter (q None, one-hot)
makes this "accept x with probability r'(x), then zero x", which is exact
for siblings chosen in any way that does not look at the target's output;
identical siblings are harmless (a repeated token has r'(x) = 0). With q
reported, the rule is exact when a node's children are i.i.d. draws from that
q; with a single child it is Leviathan et al.'s rule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.decoding.tree import Tree

Array = jax.Array


def _root_first(pending_B: Array, tokens_BxN: Array) -> Array:
  return jnp.concatenate([pending_B[:, None], tokens_BxN], axis=1)


def greedy(tree: Tree, tokens_BxN: Array, valid_BxN: Array, argmax_BxT: Array
           ) -> tuple[Array, Array, Array]:
  """(last tree index of the accepted path, its length, the next token) per row, from the
  target's argmax at each tree position (`ForwardOutput.argmax_BxR`)."""
  ok = []
  for i, p in enumerate(tree.parents):
    ok_B = valid_BxN[:, i] & (tokens_BxN[:, i] == argmax_BxT[:, p + 1])
    ok.append(ok_B if p < 0 else ok_B & ok[p])
  depth_BxN = jnp.where(jnp.stack(ok, axis=1), jnp.asarray(tree.depth_N)[None, :], 0)
  num_accepted_B = jnp.max(depth_BxN, axis=1)
  last_B = jnp.where(num_accepted_B > 0, jnp.argmax(depth_BxN, axis=1) + 1, 0)
  next_B = jnp.take_along_axis(argmax_BxT, last_B[:, None], axis=1)[:, 0]
  return last_B.astype(jnp.int32), num_accepted_B.astype(jnp.int32), next_B


def _children_TxK(tree: Tree) -> np.ndarray:
  width = max(len(c) for c in tree.children)
  table = np.full((tree.num_nodes + 1, width), -1, np.int32)
  for t, kids in enumerate(tree.children):
    table[t, :len(kids)] = kids
  return table


def sampling(tree: Tree, tokens_BxN: Array, q_BxNxV: Array | None, valid_BxN: Array,
             p_BxTxV: Array, keys_B: Array) -> tuple[Array, Array, Array]:
  """The exact rule (module docstring); p and q carry temperature, top-k, top-p."""
  batch, vocab = p_BxTxV.shape[0], p_BxTxV.shape[-1]
  rows = jnp.arange(batch)
  children_TxK = jnp.asarray(_children_TxK(tree))
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
      rx_B = r_BxV[rows, x_B]
      if q_BxNxV is None:
        q_node_BxV = jax.nn.one_hot(x_B, vocab, dtype=r_BxV.dtype)
      else:
        q_node_BxV = q_BxNxV[rows, at_B]
      qx_B = q_node_BxV[rows, x_B]
      u_B = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, level * num_kids + c)))(
          keys_B)
      # u < r'(x) / q(x) without dividing: q(x) > 0 wherever the drafter could propose x.
      accept_B = tries_B & (u_B * qx_B * total_B < rx_B)
      rejected_B = tries_B & ~accept_B
      residual_BxV = jnp.maximum(r_BxV / jnp.maximum(total_B, 1e-30)[:, None] - q_node_BxV, 0.0)
      r_BxV = jnp.where(rejected_B[:, None], residual_BxV, r_BxV)
      r_BxV = jnp.where(accept_B[:, None], p_BxTxV[rows, at_B + 1], r_BxV)
      cur_B = jnp.where(accept_B, node_B + 1, cur_B)
      moved_B |= accept_B
    # No child accepted (or none to try): the next token comes from the residual.
    stop_B = ~done_B & ~moved_B
    empty_B = jnp.sum(r_BxV, axis=-1) <= 0.0
    r_draw_BxV = jnp.where(empty_B[:, None], p_BxTxV[rows, cur_B], r_BxV)
    draw_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1_000_003 + level))(keys_B)
    next_B = jnp.where(stop_B, sampling_lib.sample(draw_keys, r_draw_BxV), next_B)
    done_B |= stop_B
  return cur_B, depth_T[cur_B], next_B


def path_BxD1(tree: Tree, last_B: Array) -> Array:
  """The accepted path as tree indices by depth: [:, 0] the root, [:, k] the path's
  node at depth k for k <= its length, and k past it (so a compaction leaves those
  slots in place)."""
  depth_T = np.concatenate([[0], tree.depth_N])
  d1 = tree.max_depth + 1
  on_depth_TxD1 = jnp.asarray(depth_T[:, None] == np.arange(d1)[None, :])
  ancestors_BxT = jnp.asarray(tree.mask_TxT)[last_B]
  hits_BxTxD1 = ancestors_BxT[:, :, None] & on_depth_TxD1[None]
  index_T = jnp.arange(tree.num_nodes + 1)
  found_BxD1 = jnp.any(hits_BxTxD1, axis=1)
  path = jnp.sum(jnp.where(hits_BxTxD1, index_T[None, :, None], 0), axis=1)
  return jnp.where(found_BxD1, path, jnp.arange(d1)[None, :]).astype(jnp.int32)
