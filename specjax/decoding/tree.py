"""A static token tree: which drafted node continues which, verified in one target call.

A tree of N nodes is a tuple of parent indices: node i continues node
`parents[i]`, and -1 means it continues the root, the row's pending token
(its last committed one, not yet in the cache). A chain of gamma drafts is
`(-1, 0, 1, ..., gamma - 2)`. Parents must come before their children
(`parents[i] < i`), which also rules out cycles, so every loop over the nodes
in index order visits a parent before its children.

In a verify call the root and the N nodes are the T = N + 1 new tokens, at
consecutive cache slots L-1 .. L-1+N (tree index t: 0 the root, i + 1 node i)
but at RoPE positions L-1 + depth: a node sees the committed context and its
own ancestors only (`mask_TxT`). After acceptance the accepted path's entries
are moved down to consecutive slots (`kv_cache.compact`), so slot s holds
position s again.

The shape is static (hashable, a jit static argument); which nodes a row
actually fills is data (a drafter's `valid_BxN`).

Shape letters: N nodes, T = N + 1 tree indices (the root first), D depth.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np


class TreeError(ValueError):
  """A tree that cannot be verified: bad parents, an unknown preset."""


@dataclasses.dataclass(frozen=True)
class Tree:
  """parents[i] is node i's parent (-1: the root). Validated on construction."""

  parents: tuple[int, ...]

  def __post_init__(self):
    parents = self.parents
    if not isinstance(parents, tuple) or not parents:
      raise TreeError(f'a tree needs at least one node (a tuple of parent indices), got {parents!r}')
    for i, p in enumerate(parents):
      if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
        raise TreeError(f'tree node {i} has parent {p!r}: parents must be integers')
      if not -1 <= p < i:
        earlier = f'or an earlier node (0..{i - 1})' if i else '(node 0 has no earlier node)'
        raise TreeError(f'tree node {i} has parent {p}: a parent must be -1 (the root) {earlier}; '
                        'parents before children also rule out cycles')
    object.__setattr__(self, 'parents', tuple(int(p) for p in parents))

  @property
  def num_nodes(self) -> int:
    return len(self.parents)

  @functools.cached_property
  def depth_N(self) -> np.ndarray:
    """Each node's depth: 1 for a child of the root."""
    depth = np.zeros(self.num_nodes, np.int32)
    for i, p in enumerate(self.parents):
      depth[i] = 1 if p < 0 else depth[p] + 1
    return depth

  @property
  def max_depth(self) -> int:
    return int(self.depth_N.max())

  @property
  def is_chain(self) -> bool:
    return self.parents == tuple(range(-1, self.num_nodes - 1))

  @functools.cached_property
  def parent_T_N(self) -> np.ndarray:
    """Each node's parent as a tree index (0 the root, i + 1 node i)."""
    return np.asarray(self.parents, np.int32) + 1

  @functools.cached_property
  def mask_TxT(self) -> np.ndarray:
    """Ancestor-or-self: mask[t, u] says tree index t may attend to tree index u."""
    t = self.num_nodes + 1
    mask = np.zeros((t, t), bool)
    mask[0, 0] = True
    for i, p in enumerate(self.parents):
      mask[i + 1] = mask[p + 1]
      mask[i + 1, i + 1] = True
    return mask

  @functools.cached_property
  def children(self) -> tuple[tuple[int, ...], ...]:
    """children[t]: the nodes (node indices) whose parent is tree index t, in order."""
    out = [[] for _ in range(self.num_nodes + 1)]
    for i, p in enumerate(self.parents):
      out[p + 1].append(i)
    return tuple(tuple(c) for c in out)

  @functools.cached_property
  def child_rank_N(self) -> np.ndarray:
    """Node i is its parent's child_rank[i]-th child (0-based)."""
    rank = np.zeros(self.num_nodes, np.int32)
    for kids in self.children:
      for r, i in enumerate(kids):
        rank[i] = r
    return rank

  def paths(self) -> list[tuple[int, ...]]:
    """Every root-to-leaf path, as node indices from the root's child down."""
    leaves = [i for i in range(self.num_nodes) if not self.children[i + 1]]
    out = []
    for leaf in leaves:
      path, i = [], leaf
      while i >= 0:
        path.append(i)
        i = self.parents[i]
      out.append(tuple(reversed(path)))
    return out

  def __str__(self) -> str:
    return ','.join(str(p) for p in self.parents)


def chain(length: int) -> Tree:
  return Tree(tuple(range(-1, length - 1)))


def from_choices(choices) -> Tree:
  """A tree from Medusa / EAGLE "choices": each node is the path of child ranks
  that reaches it, e.g. (0, 1) is the second child of the first child of the root.
  Choices must list a node after its parent."""
  index = {(): -1}
  parents = []
  for choice in choices:
    choice = tuple(choice)
    if choice[:-1] not in index:
      raise TreeError(f'tree choice {choice} comes before its parent {choice[:-1]}')
    index[choice] = len(parents)
    parents.append(index[choice[:-1]])
  return Tree(tuple(parents))


# Medusa-style (Cai et al. 2024): the top few candidates of each head, wide at the
# root and narrowing with depth, a sparse tree of 16 nodes and depth 5.
_MEDUSA_16 = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0),
              (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0))

# EAGLE-style (Li et al. 2024): deeper along the most likely branch, a few
# alternatives at every level: 25 nodes, depth 5, as EAGLE-1's default choices.
_EAGLE_25 = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1),
             (3, 0), (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 2, 0),
             (0, 2, 1), (1, 0, 0), (0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 0, 2), (0, 0, 0, 0, 0),
             (0, 0, 0, 0, 1))

PRESETS = {
    'medusa-16': from_choices(_MEDUSA_16),
    'eagle-25': from_choices(_EAGLE_25),
}
_CHAIN = re.compile(r'chain-(\d+)$')


def parse(spec: str) -> Tree:
  """A tree from a config string: a preset name ('chain-G', 'medusa-16',
  'eagle-25') or comma-separated parent indices ('-1,0,0,1')."""
  if not isinstance(spec, str) or not spec.strip():
    raise TreeError(f'a tree is a preset name or comma-separated parents, got {spec!r}')
  spec = spec.strip()
  m = _CHAIN.match(spec)
  if m:
    if int(m.group(1)) < 1:
      raise TreeError(f'tree {spec!r}: a chain needs at least one node')
    return chain(int(m.group(1)))
  if spec in PRESETS:
    return PRESETS[spec]
  if re.fullmatch(r'\s*-?\d+(\s*,\s*-?\d+)*\s*,?\s*', spec):
    return Tree(tuple(int(p) for p in spec.split(',') if p.strip()))
  raise TreeError(f'unknown tree {spec!r}: known presets are chain-<G>, '
                  f'{", ".join(PRESETS)}, or give comma-separated parent indices like -1,0,0,1')
