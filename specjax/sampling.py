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

from specjax import argmax as argmax_lib

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
    return jax.nn.one_hot(argmax_lib.argmax(logits), logits.shape[-1], dtype=jnp.float32)
  logits = logits / sampling.temperature
  vocab = logits.shape[-1]
  if 0 < sampling.top_k < vocab:
    kth_largest = jax.lax.top_k(logits, sampling.top_k)[0][..., -1:]
    logits = jnp.where(logits < kth_largest, -jnp.inf, logits)
  if sampling.top_p < 1.0:
    logits = jnp.where(nucleus(logits, sampling.top_p), logits, -jnp.inf)
  return jax.nn.softmax(logits, axis=-1)


def nucleus(logits_xV: Array, top_p: float) -> Array:
  """The tokens top-p sampling keeps: the smallest set of the most likely whose
  mass reaches top_p (every token tied with the least likely one kept too).

  Token i is kept iff the mass of the tokens strictly more likely than it,
  M(logit_i), is below top_p. M falls as the logit rises, so the kept tokens are
  those at or above one threshold, found by bisection over the logits' float32
  bit patterns (mapped to order-preserving uint32 keys): 32 masked sums over
  the vocabulary. A sort of a 262,144-token vocabulary took ~65 ms per
  position on a 2-core CPU, more than the decode step itself.
  """
  probs_xV = jax.nn.softmax(logits_xV, axis=-1)
  zeroed_xV = jnp.where(logits_xV == 0, 0.0, logits_xV)   # -0.0 ties +0.0, as a float does
  bits_xV = jax.lax.bitcast_convert_type(zeroed_xV.astype(jnp.float32), jnp.uint32)
  negative = bits_xV >> 31 == 1
  keys_xV = jnp.where(negative, ~bits_xV, bits_xV | jnp.uint32(1 << 31))  # ordered as the logits
  mass_above = lambda k_x1: jnp.sum(jnp.where(keys_xV > k_x1, probs_xV, 0.0), -1, keepdims=True)

  # Invariant: M(lo) >= top_p > M(hi); hi - lo halves each step, so 32 steps reach
  # hi = lo + 1, and hi is the smallest key whose mass above is below top_p.
  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    below = mass_above(mid) < top_p
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  lowest = jnp.min(keys_xV, -1, keepdims=True)
  lo = jnp.where(lowest > 0, lowest - 1, lowest)  # M(lowest - 1) is all the mass
  hi = jnp.max(keys_xV, -1, keepdims=True)        # nothing lies above the top
  _, threshold = jax.lax.fori_loop(0, 32, halve, (lo, hi))
  return keys_xV >= threshold


def sample(keys_B: Array, weights_BxV: Array) -> Array:
  """Draws from unnormalised non-negative weights by two exponential races.

  argmax(w / E) with E ~ Exp(1) picks index i with probability w_i / sum(w);
  zero weights can never win and no normalisation or log is needed. One race
  over the whole vocabulary draws V exponentials a row, and on a 2-core CPU
  that was most of a sampled step: over Gemma's 262,144 tokens 1.43 ms a row,
  7.30 ms for 5 rows and 95 ms for 32 (against 0.11 / 0.24 / 1.44 ms for the
  two races below; benchmarks/sampling_cost.py), beside a 14 ms decode step. So the vocabulary is cut into
  blocks of C (`argmax.chunk_size`, about sqrt(V)): a race over the blocks'
  sums S_b picks block b with probability S_b / S, and a second race inside it
  picks i with probability w_i / S_b, so i is drawn with probability w_i / S,
  from 2 sqrt(V) exponentials. One key per row; `weights` may have extra axes
  between the row and vocab axes.
  """
  vocab = weights_BxV.shape[-1]
  block = argmax_lib.chunk_size(vocab)
  num_blocks = -(-vocab // block)
  pad = [(0, 0)] * (weights_BxV.ndim - 1) + [(0, num_blocks * block - vocab)]
  blocks_BxNxC = jnp.pad(weights_BxV, pad).reshape(*weights_BxV.shape[:-1], num_blocks, block)

  def row(key, w_NxC):
    outer, inner = jax.random.split(key)
    b = _race(outer, w_NxC.sum(-1))
    within = jnp.take_along_axis(w_NxC, b[..., None, None], axis=-2)[..., 0, :]
    return b * block + _race(inner, within)
  return jax.vmap(row)(keys_B, blocks_BxNxC)


def _race(key: Array, w: Array) -> Array:
  """argmax(w / E) over the last axis, E ~ Exp(1): index i with probability w_i / sum(w)."""
  race = jax.random.exponential(key, w.shape, dtype=jnp.float32)
  # race is exactly 0 with probability 2**-23 per entry: 0 / 0 = NaN would win for a
  # zero weight, so zero weights are masked explicitly.
  return argmax_lib.argmax(jnp.where(w > 0, w / race, -1.0))


def draw(keys_B: Array, logits_BxV: Array, sampling: SamplingConfig
         ) -> tuple[Array, Array | None]:
  """One token per row and q, the distribution it was drawn from.

  Greedy: the argmax, and None for its one-hot q. Sampled: a draw from
  `probabilities(logits)`, and those probabilities.
  """
  if sampling.greedy:
    return argmax_lib.argmax(logits_BxV), None
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
