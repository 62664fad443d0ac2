"""Filling a static token tree from ranked candidate continuations (a trie, cropped).

A drafter that has several guesses for what follows (the n-gram drafter's
matches of different lengths and places) ranks them, best first. The tree's
shape is fixed (`decoding/tree.py`), so the guesses are laid into it as a trie
cropped to that shape: the k-th child of a node gets the k-th distinct next
token among the candidates that agree with the path to that node, in rank
order. Siblings are therefore distinct, the first child of each node follows
the best candidate still consistent (so a chain-shaped tree gets exactly the
best candidate), and a node with no candidate left is invalid (no evidence).

Shape letters: B batch, M candidates, D depth, N tree nodes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def fill_ranked_level(tree, depth: int, children_of, min_confidence: float, tokens: list,
                      valid: list) -> list[int]:
  """Fills the nodes at `depth` in place from ranked children (a drafter that drafts
  a tree one depth at a time: EAGLE, a draft model). `children_of(t)` is
  (token_BxR, prob_BxR), the R most likely tokens after tree index t, best first;
  node i, its parent's r-th child, takes column r, and is valid when that token is
  at least `min_confidence` likely and its parent is valid. Returns the nodes at
  `depth` that have children, the ones to run the drafter over next."""
  level = [i for i in range(tree.num_nodes) if tree.depth_N[i] == depth]
  for i in level:
    parent, rank = tree.parents[i], int(tree.child_rank_N[i])
    token_BxR, prob_BxR = children_of(parent + 1)
    tokens[i] = token_BxR[:, rank]
    ok_B = prob_BxR[:, rank] >= min_confidence
    valid[i] = ok_B if parent < 0 else ok_B & valid[parent]
  return [i for i in level if tree.children[i + 1]]


def fill(tree, candidates_BxMxD: Array, valid_BxM: Array) -> tuple[Array, Array]:
  """(tokens_BxN, valid_BxN) for `tree` (a decoding.tree.Tree); D >= its depth."""
  num_cands = candidates_BxMxD.shape[1]
  earlier_MxM = jnp.asarray(np.tril(np.ones((num_cands, num_cands), bool), -1))  # [m, m'] m' < m
  consistent = {-1: valid_BxM}
  tokens, valid = [], []
  for i, (parent, depth, rank) in enumerate(zip(tree.parents, tree.depth_N, tree.child_rank_N)):
    agree_BxM = consistent[parent]
    next_BxM = candidates_BxMxD[:, :, depth - 1]
    same_BxMxM = next_BxM[:, :, None] == next_BxM[:, None, :]
    repeat_BxM = jnp.any(same_BxMxM & agree_BxM[:, None, :] & earlier_MxM[None], axis=2)
    first_BxM = agree_BxM & ~repeat_BxM
    pick_BxM = first_BxM & (jnp.cumsum(first_BxM, axis=1) - 1 == rank)
    valid_B = jnp.any(pick_BxM, axis=1)
    token_B = jnp.sum(jnp.where(pick_BxM, next_BxM, 0), axis=1)
    consistent[i] = agree_BxM & (next_BxM == token_B[:, None]) & valid_B[:, None]
    tokens.append(token_B)
    valid.append(valid_B)
  return jnp.stack(tokens, axis=1).astype(jnp.int32), jnp.stack(valid, axis=1)
