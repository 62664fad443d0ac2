"""A smaller model of the same vocabulary drafts autoregressively (SpS).

The drafter keeps its own KV cache, laid out like the target's: slot s holds
position s. `init` prefills the prompt; `update` feeds the last T committed
tokens, T the target call's width (at least 2): a call commits at most T, so
every position committed since the last update is fed, whoever drafted it.
The drafter's own accepted drafts are rewritten with the same values; the
last draft after full acceptance, which it never fed, and drafts n-gram
lookup made in a hybrid (`hybrid.py`), which it never saw, are written for
the first time. Every earlier committed position was fed before.

Each draft token is drawn by `sampling.draw`: the argmax when greedy (q
one-hot, returned None), else a draw from q = probabilities(logits) with the
same temperature, top-k and top-p as the target. The row's evidence is its
run of drafts at least `min_confidence` likely under the drafter.

`propose_tree` fills a static token tree as EAGLE's does: a node that is its
parent's r-th child takes the r-th most likely token after its parent. The
model runs once per depth that has children to draft, over the root and the
nodes so far in one tree-masked call (`gemma.tree_attention_mask`: each node
sees the committed cache and its own ancestors, at the position of its depth,
written at slots L-1 .. L-1+N as the target's verify call writes them), so
every root-to-node path drafts what `propose` would draft along it. Siblings
are distinct and ranked, never sampled, so q is one-hot (None) and the tree
rule stays exact under sampling. The slots past the pending token that the
tree wrote hold nodes, not committed tokens; `update` feeds every committed
position from the pending one on (the call's width is the tree's depth + 1),
and a slot past a row's length is never read, so they do no harm.

With a draft vocabulary (`vocab_ids_N`, as a distilled drafter from
`python -m specjax.train --config=configs/train_distilled.py` ships) the
model's head scores only those N rows of its tied table, gathered once: its
forward stops at the final norm, and q is the draw over the subset scattered
into V (`draft_vocab.draw`), zero elsewhere.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.drafters import candidate_tree
from specjax.drafters import confidence
from specjax.drafters import draft_vocab
from specjax.models.language_model import LanguageModel

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Settings:
  """checkpoint: the draft model (same vocabulary as the target).
  min_confidence: drafts less likely than this under the drafter end its evidence."""

  checkpoint: str = ''
  min_confidence: float = 0.0

  def __post_init__(self):
    if not 0.0 <= self.min_confidence < 1.0:
      raise ValueError(f'min_confidence must be in [0, 1), got {self.min_confidence}')


def make(model: LanguageModel, params, settings: Settings = Settings(),
         name: str = 'draft_model', vocab_ids_N: np.ndarray | None = None) -> base.Drafter:
  """The drafter for `model` and its `params`; `vocab_ids_N` restricts its head to
  those token ids (the rows of its own tied table)."""
  cfg = model.config
  ids = draft_vocab.checked_ids(vocab_ids_N, cfg.vocab_size, 'draft model')
  head_NxD, head_q8 = (None, None) if ids is None else draft_vocab.head_rows(params, ids)
  drafter_params = {'model': params, 'ids_N': None if ids is None else jnp.asarray(ids),
                    'head_NxD': head_NxD, 'head_q8': head_q8}

  def forward_at(params, tokens_BxT, positions_BxT, cache, index_BxR, tree_mask=None):
    """The new cache and the logits at positions `index_BxR` of the call, over the
    draft vocabulary when there is one."""
    if params['head_NxD'] is None:
      out = model.forward(params['model'], tokens_BxT, positions_BxT, cache, index_BxR,
                          tree_mask=tree_mask)
      return out.cache, out.logits_BxRxV
    out = model.forward(params['model'], tokens_BxT, positions_BxT, cache, logits=False,
                        tree_mask=tree_mask)
    hidden_BxRxD = jnp.take_along_axis(out.hidden_BxTxD, index_BxR[:, :, None], axis=1)
    b, r, d = hidden_BxRxD.shape
    logits = draft_vocab.head_logits(params['head_NxD'], hidden_BxRxD.reshape(b * r, d), cfg,
                                     params['head_q8'])
    return out.cache, logits.reshape(b, r, -1)

  def forward(params, tokens_BxT, positions_BxT, cache, last_B=None):
    """The new cache and the logits at `last_B` (default: the last position)."""
    if last_B is None:
      last_B = jnp.full((tokens_BxT.shape[0],), tokens_BxT.shape[1] - 1, jnp.int32)
    cache, logits_Bx1xV = forward_at(params, tokens_BxT, positions_BxT, cache, last_B[:, None])
    return cache, logits_Bx1xV[:, 0]

  def feed_committed(params, cache, tokens_BxS, lengths_B, width):
    """Feeds the last `width` committed tokens (positions L - width .. L - 1)."""
    rows = jnp.arange(tokens_BxS.shape[0])
    positions_BxW = jnp.maximum(lengths_B[:, None] - width + jnp.arange(width)[None, :], 0)
    cache, logits = forward(params, tokens_BxS[rows[:, None], positions_BxW], positions_BxW,
                            cache)
    return {'cache': cache, 'next_logits_BxV': logits}

  def init(*, params, target: base.TargetView):
    tokens_BxS, lengths_B = target.tokens_BxS, target.lengths_B
    batch, num_slots = tokens_BxS.shape
    prompt_len = target.positions_BxT.shape[1]
    positions_BxT = jnp.broadcast_to(jnp.arange(prompt_len), (batch, prompt_len))
    cache, _ = forward(params, tokens_BxS[:, :prompt_len], positions_BxT,
                       model.init_cache(batch, num_slots), jnp.zeros((batch,), jnp.int32))
    return feed_committed(params, cache, tokens_BxS, lengths_B, 2)

  def update(*, params, state, target: base.TargetView):
    width = max(target.positions_BxT.shape[1], 2)
    return feed_committed(params, state['cache'], target.tokens_BxS, target.lengths_B, width)

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del tokens_BxS, shared
    ids_N = params['ids_N']

    def draw(keys, logits_BxV):
      token_B, index_B, q_BxV = draft_vocab.draw(keys, logits_BxV, ids_N, cfg.vocab_size,
                                                 sampling)
      return token_B, q_BxV, confidence.draft_probability(logits_BxV, index_B)

    def step(carry, i):
      cache, logits_BxV = carry
      token_B, q_BxV, prob_B = draw(sampling_lib.step_keys(keys_B, i), logits_BxV)
      cache, logits_BxV = forward(params, token_B[:, None], (lengths_B + i)[:, None], cache)
      return (cache, logits_BxV), (token_B, q_BxV, prob_B)

    # gamma draws, gamma - 1 forwards: the last draft is never fed here (update feeds it).
    carry = (state['cache'], state['next_logits_BxV'])
    if gamma > 1:
      carry, (draft_GxB, q_GxBxV, prob_GxB) = jax.lax.scan(step, carry, jnp.arange(gamma - 1))
    last_B, last_q_BxV, last_prob_B = draw(sampling_lib.step_keys(keys_B, gamma - 1), carry[1])
    if gamma > 1:
      draft_BxG = jnp.concatenate([draft_GxB.T, last_B[:, None]], axis=1)
      prob_BxG = jnp.concatenate([prob_GxB.T, last_prob_B[:, None]], axis=1)
      q_BxGxV = None if last_q_BxV is None else jnp.concatenate(
          [q_GxBxV.transpose(1, 0, 2), last_q_BxV[:, None]], axis=1)
    else:
      draft_BxG, prob_BxG = last_B[:, None], last_prob_B[:, None]
      q_BxGxV = None if last_q_BxV is None else last_q_BxV[:, None]
    num_drafts_B = confidence.confident_prefix(prob_BxG, settings.min_confidence)
    return base.Proposal(draft_BxG, q_BxGxV, num_drafts_B,
                         {'cache': carry[0], 'next_logits_BxV': carry[1]})

  def propose_tree(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, tree, shared=None):
    del keys_B, sampling, shared
    ids_N = params['ids_N']
    batch, num_nodes = lengths_B.shape[0], tree.num_nodes
    start_B = lengths_B - 1
    pending_Bx1 = jnp.take_along_axis(tokens_BxS, start_B[:, None], axis=1)
    depth_T = np.concatenate([[0], tree.depth_N]).astype(np.int32)
    cache = state['cache']
    logits_T = {0: state['next_logits_BxV']}   # tree index -> the logits after it
    ranked = {}   # tree index -> (token_BxR, prob_BxR) of its R most likely children

    def children_of(t):
      if t not in ranked:
        r = 1 + max(int(tree.child_rank_N[i]) for i in tree.children[t])
        ranked[t] = draft_vocab.ranked(logits_T[t], r, ids_N)
      return ranked[t]

    tokens = [jnp.zeros((batch,), jnp.int32)] * num_nodes
    valid = [None] * num_nodes
    for depth in range(1, tree.max_depth + 1):
      expand = candidate_tree.fill_ranked_level(tree, depth, children_of,
                                                settings.min_confidence, tokens, valid)
      if not expand:
        continue
      # The root and the nodes up to the last to expand (ancestors come first); a node
      # not drafted yet is a placeholder no expanded node sees.
      t = max(expand) + 2
      cache, logits_BxWxV = forward_at(
          params, jnp.concatenate([pending_Bx1, jnp.stack(tokens[:t - 1], axis=1)], axis=1),
          start_B[:, None] + jnp.asarray(depth_T[:t])[None, :], cache,
          jnp.broadcast_to(jnp.asarray(expand, jnp.int32) + 1, (batch, len(expand))),
          tree_mask=jnp.asarray(tree.mask_TxT[:t, :t]))
      for w, i in enumerate(expand):
        logits_T[i + 1] = logits_BxWxV[:, w]
    return base.TreeProposal(jnp.stack(tokens, axis=1), None, jnp.stack(valid, axis=1),
                             {'cache': cache, 'next_logits_BxV': state['next_logits_BxV']})

  return base.Drafter(name=name, vocab_size=cfg.vocab_size, init=init, update=update,
                      propose=propose, params=drafter_params, costly_drafts=True,
                      propose_tree=propose_tree)
