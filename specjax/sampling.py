"""Turning logits into tokens: the one place that decides greedy or sampled.

Speculative sampling is exact only if the target's p and the drafter's q are
processed by the same rule (temperature, then top-k, then top-p), so both go
through `probabilities`, and every token anywhere (the target's first token,
a plain decode step, a drafter's proposal) is drawn by `draw`. Greedy decoding
is temperature 0: an argmax whose q is one-hot (returned as None), never a
division by zero. This module sits below both `decoding` and `drafters`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """temperature 0 means greedy; top_k 0 and top_p 1 switch those filters off."""

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not self.temperature >= 0.0:
      raise ValueError(f'temperature must be >= 0 (0 is greedy), got {self.temperature}')
    if self.top_k < 0:
      raise ValueError(f'top_k must be >= 0 (0 switches it off), got {self.top_k}')
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f'top_p must be in (0, 1], got {self.top_p}')

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def probabilities(logits_xV: Array, sampling: SamplingConfig) -> Array:
  """The float32 distribution a token is sampled from, over the last axis."""
  logits = logits_xV.astype(jnp.float32)
  if sampling.greedy:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  logits = logits / sampling.temperature
  vocab = logits.shape[-1]
  if 0 < sampling.top_k < vocab:
    kth_largest = jax.lax.top_k(logits, sampling.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
  if sampling.top_p < 1.0:
    # Keep the smallest set of most likely tokens whose mass reaches top_p.
    sorted_desc = -jnp.sort(-logits, axis=-1)
    sorted_probs = jax.nn.softmax(sorted_desc, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    kept = mass_before < sampling.top_p
    cutoff = jnp.min(jnp.where(kept, sorted_desc, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < cutoff, -jnp.inf, logits)
  return jax.nn.softmax(logits, axis=-1)


def sample(keys_B: Array, weights_BxV: Array) -> Array:
  """Draws from unnormalised non-negative weights by an exponential race.

  argmax(w / E) with E ~ Exp(1) picks index i with probability w_i / sum(w);
  zero weights can never win and no normalisation or log is needed. One key
  per row; `weights` may have extra axes between the row and vocab axes.
  """
  def row(key, w):
    race = jax.random.exponential(key, w.shape, dtype=jnp.float32)
    # race is exactly 0 with probability 2**-23 per entry: 0 / 0 = NaN would win for a
    # zero weight, so zero weights are masked explicitly.
    return jnp.argmax(jnp.where(w > 0, w / race, -1.0), axis=-1).astype(jnp.int32)
  return jax.vmap(row)(keys_B, weights_BxV)


def draw(keys_B: Array, logits_BxV: Array, sampling: SamplingConfig
         ) -> tuple[Array, Array | None]:
  """One token per row and q, the distribution it was drawn from.

  Greedy: the argmax, and None for its one-hot q. Sampled: a draw from
  `probabilities(logits)`, and those probabilities.
  """
  if sampling.greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32), None
  q_BxV = probabilities(logits_BxV, sampling)
  return sample(keys_B, q_BxV), q_BxV


def next_token(keys_B: Array, logits_BxV: Array, sampling: SamplingConfig) -> Array:
  return draw(keys_B, logits_BxV, sampling)[0]


def row_keys(seed: int, row_ids) -> Array:
  """One rng stream per prompt, so a row's draws never depend on its batch."""
  base = jax.random.key(seed)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(row_ids, jnp.uint32))


def step_keys(keys_B: Array, step: Array, stream: int = 0) -> Array:
  """The keys of one loop step (and one named stream) for every row."""
  return jax.vmap(lambda k: jax.random.fold_in(jax.random.fold_in(k, step), stream))(keys_B)
