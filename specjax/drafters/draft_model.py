"""A smaller model of the same vocabulary drafts autoregressively (SpS).

The drafter keeps its own KV cache, laid out like the target's: slot s holds
position s. `init` prefills the prompt; `update` feeds the last two committed
tokens (positions L-2 and L-1): after a rejection the first of them is already
cached and is rewritten with the same value; after full acceptance it is the
last draft, which the drafter never fed, so the bonus case leaves no hole in
its cache. Two tokens always suffice because every earlier committed position
was fed before.

Each draft token is drawn by `sampling.draw`: the argmax when greedy (q
one-hot, returned None), else a draw from q = probabilities(logits) with the
same temperature, top-k and top-p as the target. The row's evidence is its
run of drafts at least `min_confidence` likely under the drafter.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.drafters import confidence
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


def _feed_last_two(model, params, cache, tokens_BxS, lengths_B):
  rows = jnp.arange(tokens_BxS.shape[0])
  positions_Bx2 = jnp.maximum(lengths_B[:, None] - 2 + jnp.arange(2)[None, :], 0)
  out = model.forward(params, tokens_BxS[rows[:, None], positions_Bx2], positions_Bx2, cache,
                      jnp.ones_like(lengths_B)[:, None])
  return {'cache': out.cache, 'next_logits_BxV': out.logits_BxRxV[:, 0]}


def make(model: LanguageModel, params, settings: Settings = Settings(),
         name: str = 'draft_model') -> base.Drafter:

  def init(*, params, target: base.TargetView):
    tokens_BxS, lengths_B = target.tokens_BxS, target.lengths_B
    batch, num_slots = tokens_BxS.shape
    prompt_len = target.positions_BxT.shape[1]
    positions_BxT = jnp.broadcast_to(jnp.arange(prompt_len), (batch, prompt_len))
    out = model.forward(params, tokens_BxS[:, :prompt_len], positions_BxT,
                        model.init_cache(batch, num_slots), jnp.zeros((batch, 1), jnp.int32))
    return _feed_last_two(model, params, out.cache, tokens_BxS, lengths_B)

  def update(*, params, state, target: base.TargetView):
    return _feed_last_two(model, params, state['cache'], target.tokens_BxS, target.lengths_B)

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del tokens_BxS, shared

    def step(carry, i):
      cache, logits_BxV = carry
      keys = sampling_lib.step_keys(keys_B, i)
      token_B, q_BxV = sampling_lib.draw(keys, logits_BxV, sampling)
      prob_B = confidence.draft_probability(logits_BxV, token_B)
      out = model.forward(params, token_B[:, None], (lengths_B + i)[:, None], cache)
      return (out.cache, out.logits_BxRxV[:, 0]), (token_B, q_BxV, prob_B)

    # gamma draws, gamma - 1 forwards: the last draft is never fed here (update feeds it).
    carry = (state['cache'], state['next_logits_BxV'])
    if gamma > 1:
      carry, (draft_GxB, q_GxBxV, prob_GxB) = jax.lax.scan(step, carry, jnp.arange(gamma - 1))
    last_B, last_q_BxV = sampling_lib.draw(sampling_lib.step_keys(keys_B, gamma - 1), carry[1],
                                           sampling)
    last_prob_B = confidence.draft_probability(carry[1], last_B)
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

  return base.Drafter(name=name, vocab_size=model.config.vocab_size, init=init, update=update,
                      propose=propose, params=params, costly_drafts=True)
