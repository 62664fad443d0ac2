"""Prefill: run every prompt through the model and draw each row's first token.

Shared by autoregressive and speculative decoding, so both start from the
same cache and the same first token (drawn from the target with the row's
step-0 key): after it, the row's last committed token is the one "pending"
token whose keys and values are not yet in the cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax.decoding import sampling as sampling_lib
from specjax.models.language_model import LanguageModel

Array = jax.Array


def prefill(model: LanguageModel, params, tokens_BxS: Array, lengths_B: Array, prefill_len: int,
            cache, num_layers: int | None = None):
  """Writes the prompts' KV; returns the logits at each row's last prompt token."""
  batch = tokens_BxS.shape[0]
  tokens_BxT = tokens_BxS[:, :prefill_len]
  positions_BxT = jnp.broadcast_to(jnp.arange(prefill_len, dtype=jnp.int32), (batch, prefill_len))
  last_Bx1 = (lengths_B - 1)[:, None]
  logits_Bx1xV, cache = model.forward(params, tokens_BxT, positions_BxT, cache, last_Bx1,
                                      num_layers)
  return logits_Bx1xV[:, 0], cache


def commit_first_token(tokens_BxS: Array, lengths_B: Array, logits_BxV: Array, keys_B: Array,
                       sampling: sampling_lib.SamplingConfig):
  """Samples and appends the first new token of every row."""
  first_B = sampling_lib.next_token(sampling_lib.step_keys(keys_B, 0), logits_BxV, sampling)
  tokens_BxS = tokens_BxS.at[jnp.arange(tokens_BxS.shape[0]), lengths_B].set(first_B)
  return tokens_BxS, lengths_B + 1, first_B


def is_stop(token_B: Array, eos_ids: tuple[int, ...]) -> Array:
  stop = jnp.zeros(token_B.shape, bool)
  for eos in eos_ids:
    stop |= token_B == eos
  return stop
