"""Self-speculation (LayerSkip-style): the target's first k layers draft.

The drafter is the target truncated after layer k, then the final norm and the
tied head. It shares the target's weights and the KV cache of those k layers:
the target's verify pass rewrites every slot the drafter wrote (the pending
token and the drafts, positions L-1 .. L+gamma-2) with the full model's own
values, so sharing needs no copy and leaves no stale entry below a row's
committed length. Each draft step is one truncated forward of one token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoding import sampling as sampling_lib
from specjax.drafters import base
from specjax.models.language_model import LanguageModel

_DRAFT_STREAM = 2


def make(target: LanguageModel, num_layers: int) -> base.Drafter:
  if not 1 <= num_layers < target.config.num_layers:
    raise ValueError(f'early_exit_layers must be in [1, {target.config.num_layers - 1}] '
                     f'for this target, got {num_layers}')

  def propose(dparams, state, tokens_BxS, lengths_B, keys_B, sampling, gamma,
              target_params, target_cache):
    del dparams
    rows = jnp.arange(tokens_BxS.shape[0])
    pending_B = tokens_BxS[rows, lengths_B - 1]

    def step(carry, i):
      cache, token_B = carry
      logits_Bx1xV, cache = target.forward(target_params, token_B[:, None],
                                           (lengths_B - 1 + i)[:, None], cache,
                                           num_layers=num_layers)
      logits_BxV = logits_Bx1xV[:, 0]
      if sampling.greedy:
        new_B = jnp.argmax(logits_BxV, -1).astype(jnp.int32)
        return (cache, new_B), (new_B, jnp.zeros((), jnp.float32))
      q_BxV = sampling_lib.probabilities(logits_BxV, sampling)
      new_B = sampling_lib.sample(sampling_lib.step_keys(keys_B, i, stream=_DRAFT_STREAM), q_BxV)
      return (cache, new_B), (new_B, q_BxV)

    (target_cache, _), (draft_GxB, q_GxBxV) = jax.lax.scan(
        step, (target_cache, pending_B), jnp.arange(gamma))
    q_BxGxV = None if sampling.greedy else q_GxBxV.transpose(1, 0, 2)
    return draft_GxB.T, q_BxGxV, state, target_cache

  return base.Drafter(name='early_exit', vocab_size=target.config.vocab_size,
                      init=base.no_state_init, update=base.no_state_update, propose=propose)
