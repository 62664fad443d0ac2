"""A smaller model of the same vocabulary drafts autoregressively (SpS).

The drafter keeps its own KV cache, laid out like the target's: slot s holds
position s. `update` feeds the last two committed tokens (positions L-2 and
L-1): after a rejection the first of them is already cached and is rewritten
with the same value; after full acceptance it is the last draft, which the
drafter never fed, so the bonus case leaves no hole in its cache. Two tokens
always suffice because every earlier committed position was fed before.

With temperature 0 the drafter takes its argmax (q one-hot, returned None);
otherwise it samples from q = probabilities(logits) with the same temperature,
top-k and top-p as the target, and returns q for the acceptance rule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoding import prefill as prefill_lib
from specjax.decoding import sampling as sampling_lib
from specjax.drafters import base
from specjax.models.language_model import LanguageModel

Array = jax.Array

_DRAFT_STREAM = 2


def make(model: LanguageModel, params, name: str = 'draft_model') -> base.Drafter:

  def init(dparams, tokens_BxS, lengths_B, prefill_len, target_cache):
    del target_cache
    batch, num_slots = tokens_BxS.shape
    cache = model.init_cache(batch, num_slots)
    _, cache = prefill_lib.prefill(model, dparams, tokens_BxS, lengths_B, prefill_len, cache)
    logits_BxV = jnp.zeros((batch, model.config.vocab_size), jnp.float32)
    return {'cache': cache, 'next_logits_BxV': logits_BxV}

  def update(dparams, state, tokens_BxS, lengths_B):
    rows = jnp.arange(tokens_BxS.shape[0])
    positions_Bx2 = jnp.maximum(lengths_B[:, None] - 2 + jnp.arange(2)[None, :], 0)
    tokens_Bx2 = tokens_BxS[rows[:, None], positions_Bx2]
    logits_Bx2xV, cache = model.forward(dparams, tokens_Bx2, positions_Bx2, state['cache'],
                                        jnp.ones_like(lengths_B)[:, None])
    return {'cache': cache, 'next_logits_BxV': logits_Bx2xV[:, 0]}

  def propose(dparams, state, tokens_BxS, lengths_B, keys_B, sampling, gamma,
              target_params, target_cache):
    del tokens_BxS, target_params

    def draw(logits_BxV, step):
      if sampling.greedy:
        return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32), None
      q_BxV = sampling_lib.probabilities(logits_BxV, sampling)
      keys = sampling_lib.step_keys(keys_B, step, stream=_DRAFT_STREAM)
      return sampling_lib.sample(keys, q_BxV), q_BxV

    def step(carry, i):
      cache, logits_BxV = carry
      token_B, q_BxV = draw(logits_BxV, i)
      logits_Bx1xV, cache = model.forward(dparams, token_B[:, None], (lengths_B + i)[:, None],
                                          cache)
      return (cache, logits_Bx1xV[:, 0]), (token_B, q_BxV)

    carry = (state['cache'], state['next_logits_BxV'])
    if gamma > 1:
      carry, (draft_GxB, q_GxBxV) = jax.lax.scan(step, carry, jnp.arange(gamma - 1))
    else:
      draft_GxB, q_GxBxV = jnp.zeros((0,) + lengths_B.shape, jnp.int32), None
    last_B, last_q_BxV = draw(carry[1], gamma - 1)
    draft_BxG = jnp.concatenate([draft_GxB.T, last_B[:, None]], axis=1)
    q_BxGxV = None
    if not sampling.greedy:
      parts = [last_q_BxV[:, None]] if q_GxBxV is None else [q_GxBxV.transpose(1, 0, 2),
                                                              last_q_BxV[:, None]]
      q_BxGxV = jnp.concatenate(parts, axis=1)
    return draft_BxG, q_BxGxV, {'cache': carry[0], 'next_logits_BxV': carry[1]}, target_cache

  return base.Drafter(name=name, vocab_size=model.config.vocab_size, init=init, update=update,
                      propose=propose, params=params)
