"""Medusa heads (Cai et al. 2024): K small heads on the target's own last hidden state.

The target's head turns the final-norm hidden state h at position t into its
prediction of token t+1; Medusa head k (0-based) guesses token t+2+k from the
same h, so one verify call's hidden state yields gamma <= K drafts with no
draft-model pass at all. Each head is Medusa-1's residual block,

  h_k = h + SiLU(W_k h + b_k),   logits_k = h_k @ E^T,

scored against the target's own frozen tied embedding E (or the rows of a
reduced draft vocabulary, `vocab_ids_N`), so a head adds D*D + D weights:
four heads for Gemma 3 270M are 1.6M parameters (6.6 MB in float32). W = 0
gives h_k = h: an untrained head repeats the target's next-token guess.

Medusa's own shape is a token tree (`propose_tree`): a node at depth d that is
its parent's r-th child takes head d-1's r-th most likely token, so one verify
call tries the heads' top candidates in combination.

The drafter reads the hidden state that produced the row's pending token: at
init the last prompt position's, after a verify call the one at the row's
accepted count (the corrected or bonus token came from it), after a plain
step the call's only position. It reads the embedding through the target's
params (`shares_target_cache`, the cache passed back untouched), so nothing
of the 262,144 x 640 table is copied.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.drafters import confidence
from specjax.drafters import draft_vocab
from specjax.models import gemma
from specjax.models.language_model import LanguageModel

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Settings:
  """checkpoint: trained heads (a directory `specjax.train` wrote); '' = untrained.
  min_confidence: drafts less likely than this under their head end the evidence."""

  checkpoint: str = ''
  min_confidence: float = 0.0

  def __post_init__(self):
    if not 0.0 <= self.min_confidence < 1.0:
      raise ValueError(f'min_confidence must be in [0, 1), got {self.min_confidence}')


def init_heads(num_heads: int, width: int, dtype=jnp.float32) -> dict[str, Array]:
  """Medusa-1's initialisation: W = 0, b = 0, so every head starts as the target's head."""
  return {'w_KxDxD': jnp.zeros((num_heads, width, width), dtype),
          'b_KxD': jnp.zeros((num_heads, width), dtype)}


def head_features(heads: dict[str, Array], hidden_BxD: Array) -> Array:
  """h_k = h + SiLU(W_k h + b_k) for every head: [B, K, D]."""
  h = hidden_BxD.astype(jnp.float32)
  pre_BxKxD = (jnp.einsum('kod,bd->bko', heads['w_KxDxD'].astype(jnp.float32), h)
               + heads['b_KxD'].astype(jnp.float32)[None])
  return h[:, None, :] + jax.nn.silu(pre_BxKxD)


def head_logits(heads: dict[str, Array], head_NxD: Array, hidden_BxD: Array,
                softcap: float | None = None, head_q8: tuple[Array, Array] | None = None
                ) -> Array:
  """Each head's logits over the N rows of `head_NxD`: [B, K, N], float32; `head_q8`: the
  rows' int8 form (`draft_vocab.head_form`), where there is one."""
  features_BxKxD = head_features(heads, hidden_BxD)
  b, k, d = features_BxKxD.shape
  logits = gemma.linear(features_BxKxD.reshape(b * k, 1, d), head_NxD, out_dtype=jnp.float32,
                        q8=head_q8)
  logits = logits.reshape(b, k, head_NxD.shape[0])
  if softcap is not None:
    logits = jnp.tanh(logits / softcap) * softcap
  return logits


def head_matrix(target_params, vocab_ids_N: Array | None) -> Array:
  embedding_VxD = target_params['embedding_VxD']
  return (embedding_VxD if vocab_ids_N is None
          else draft_vocab.reduced_head(embedding_VxD, vocab_ids_N))


def _hidden_at(hidden_BxTxD: Array, index_B: Array) -> Array:
  rows = jnp.arange(hidden_BxTxD.shape[0])
  return hidden_BxTxD[rows, jnp.clip(index_B, 0, hidden_BxTxD.shape[1] - 1)]


def make(target: LanguageModel, heads: dict[str, Any], settings: Settings = Settings(),
         vocab_ids_N: np.ndarray | None = None, target_params=None) -> base.Drafter:
  """The drafter for trained (or freshly initialised) `heads` on `target`.

  With a draft vocabulary and `target_params`, its rows of the tied table are
  gathered once here, not in every draft step.
  """
  cfg = target.config
  num_heads, width, _ = np.shape(heads['w_KxDxD'])
  if width != cfg.embed_dim:
    raise ValueError(f'medusa heads are {width} wide but the target is {cfg.embed_dim}: '
                     'they were trained for another target')
  ids = draft_vocab.checked_ids(vocab_ids_N, cfg.vocab_size, 'medusa draft')
  head_NxD, head_q8 = (None, None) if ids is None or target_params is None else \
      draft_vocab.head_rows(target_params, ids)
  params = {'heads': jax.tree.map(jnp.asarray, heads),
            'vocab_ids_N': None if ids is None else jnp.asarray(ids),
            'head_NxD': head_NxD, 'head_q8': head_q8}

  def head(params, target_params):
    """(float32 rows, their int8 form or None) of the draft head."""
    if params['head_NxD'] is not None:
      return params['head_NxD'], params['head_q8']
    return draft_vocab.head_rows(target_params, params['vocab_ids_N'])

  def init(*, params, target: base.TargetView):
    del params
    # The first new token came from the last prompt position, lengths - 2 after it.
    return {'hidden_BxD': _hidden_at(target.hidden_BxTxD, target.lengths_B - 2)}

  def update(*, params, state, target: base.TargetView):
    del params, state
    return {'hidden_BxD': _hidden_at(target.hidden_BxTxD, target.num_accepted_B)}

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del tokens_BxS
    if gamma > num_heads:
      raise ValueError(f'medusa has {num_heads} heads, so it drafts at most {num_heads} tokens; '
                       f'gamma is {gamma}')
    target_params, target_cache = shared
    head_NxD, head_q8 = head(params, target_params)
    logits_BxKxN = head_logits(params['heads'], head_NxD, state['hidden_BxD'],
                               cfg.final_logit_softcap, head_q8)
    drafts, qs, probs = [], [], []
    ids_N = params['vocab_ids_N']
    for k in range(gamma):
      keys = sampling_lib.step_keys(keys_B, k)
      # With a draft vocabulary, q is over the subset, scattered into V (zero elsewhere).
      token_B, index_B, q_BxV = draft_vocab.draw(keys, logits_BxKxN[:, k], ids_N,
                                                 cfg.vocab_size, sampling)
      probs.append(confidence.draft_probability(logits_BxKxN[:, k], index_B))
      drafts.append(token_B)
      if q_BxV is not None:
        qs.append(q_BxV)
    draft_BxG = jnp.stack(drafts, axis=1).astype(jnp.int32)
    q_BxGxV = jnp.stack(qs, axis=1) if qs else None
    num_drafts_B = confidence.confident_prefix(jnp.stack(probs, axis=1), settings.min_confidence)
    del lengths_B
    return base.Proposal(draft_BxG, q_BxGxV, num_drafts_B, state, shared_cache=target_cache)

  def propose_tree(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, tree, shared=None):
    """Medusa's tree: a node at depth d that is its parent's r-th child takes head d-1's
    r-th most likely token. Siblings are distinct and chosen without looking at the
    target, so q is one-hot (None) and the tree rule stays exact under sampling."""
    del tokens_BxS, lengths_B, keys_B, sampling
    if tree.max_depth > num_heads:
      raise ValueError(f'medusa has {num_heads} heads, so its trees are at most {num_heads} '
                       f'deep; this tree is {tree.max_depth} deep')
    target_params, target_cache = shared
    head_NxD, head_q8 = head(params, target_params)
    logits_BxKxN = head_logits(params['heads'], head_NxD, state['hidden_BxD'],
                               cfg.final_logit_softcap, head_q8)
    width = int(tree.child_rank_N.max()) + 1
    top_logits_BxKxW, top_BxKxW = jax.lax.top_k(logits_BxKxN, width)
    head_N, rank_N = np.asarray(tree.depth_N) - 1, np.asarray(tree.child_rank_N)
    index_BxN = top_BxKxW[:, head_N, rank_N]
    ids_N = params['vocab_ids_N']
    tokens_BxN = (index_BxN if ids_N is None else ids_N[index_BxN]).astype(jnp.int32)
    # Evidence: the node's token is at least min_confidence likely under its head, and
    # so is every ancestor's.
    logz_BxK = jax.nn.logsumexp(logits_BxKxN, axis=-1)
    prob_BxN = jnp.exp(top_logits_BxKxW[:, head_N, rank_N] - logz_BxK[:, head_N])
    confident = []
    for i, parent in enumerate(tree.parents):
      ok_B = prob_BxN[:, i] >= settings.min_confidence
      confident.append(ok_B if parent < 0 else ok_B & confident[parent])
    return base.TreeProposal(tokens_BxN, None, jnp.stack(confident, axis=1), state,
                             shared_cache=target_cache)

  return base.Drafter(name='medusa', vocab_size=cfg.vocab_size, init=init, update=update,
                      propose=propose, params=params, shares_target_cache=True,
                      propose_tree=propose_tree, costly_drafts=True)
