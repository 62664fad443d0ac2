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
  ids = None
  if vocab_ids_N is not None:
    ids = np.asarray(vocab_ids_N, np.int32)
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= cfg.vocab_size:
      raise ValueError(f'draft model vocabulary must be ids in [0, {cfg.vocab_size}), '
                       f'got shape {ids.shape}')
  drafter_params = {'model': params, 'ids_N': None if ids is None else jnp.asarray(ids),
                    'head_NxD': None if ids is None else draft_vocab.reduced_head(
                        params['embedding_VxD'], jnp.asarray(ids))}

  def forward(params, tokens_BxT, positions_BxT, cache, last_B=None):
    """The new cache and the logits at `last_B` (default: the last position), over the
    draft vocabulary when there is one."""
    if last_B is None:
      last_B = jnp.full((tokens_BxT.shape[0],), tokens_BxT.shape[1] - 1, jnp.int32)
    if params['head_NxD'] is None:
      out = model.forward(params['model'], tokens_BxT, positions_BxT, cache, last_B[:, None])
      return out.cache, out.logits_BxRxV[:, 0]
    out = model.forward(params['model'], tokens_BxT, positions_BxT, cache, logits=False)
    hidden_BxD = jnp.take_along_axis(out.hidden_BxTxD, last_B[:, None, None], axis=1)[:, 0]
    return out.cache, draft_vocab.head_logits(params['head_NxD'], hidden_BxD, cfg)

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

  return base.Drafter(name=name, vocab_size=cfg.vocab_size, init=init, update=update,
                      propose=propose, params=drafter_params, costly_drafts=True)
