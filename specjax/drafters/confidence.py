"""Draft confidence: how many leading drafts a model-based drafter stands behind.

A draft token whose probability under the drafter is below `min_confidence`
is likely rejected, and so is everything after it; the row's evidence is the
run of confident drafts from the front. With min_confidence 0 every draft
counts (the fixed-gamma behaviour).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def draft_probability(logits_BxV: Array, token_B: Array) -> Array:
  """The drafter's probability of the token it drafted (softmax of its raw logits)."""
  logp_BxV = jax.nn.log_softmax(logits_BxV.astype(jnp.float32), axis=-1)
  return jnp.exp(jnp.take_along_axis(logp_BxV, token_B[:, None], axis=-1)[:, 0])


def confident_prefix(prob_BxG: Array, min_confidence: float) -> Array:
  """Length of each row's run of drafts with probability >= min_confidence."""
  ok_BxG = (prob_BxG >= min_confidence).astype(jnp.int32)
  return jnp.sum(jnp.cumprod(ok_BxG, axis=1), axis=1)
