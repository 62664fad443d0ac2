"""The acceptance rules that keep speculative output exactly the target's.

Alignment: `target_logits_BxG1xV[:, i]` is the target's prediction after the
pending token and drafts 1..i, so it scores draft token i (0-based) and, at
i = gamma, gives the bonus token. Both rules return, per row, how many drafts
were accepted (data, never a shape) and the one token that follows them: the
target's correction at the first rejection, or the bonus token.

A row may verify fewer drafts than the call's width (`num_drafts_B`, the
adaptive draft length): drafts past its count are never accepted, and when
all of its drafts are accepted the next token is the bonus token drawn from p
at that position (q = 0 there). The count is fixed before the target's output
is seen, so the rule stays exact.

Exact sampling (Leviathan et al. 2023, Chen et al. 2023): accept draft d_i
with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from
normalise(max(0, p_i - q_i)); after full acceptance draw the bonus from
p_gamma, which is the same residual formula with q_gamma = 0. p and q must be
processed by the same temperature / top-k / top-p (see sampling.py), and q is
exactly what d was drawn from: one-hot for a deterministic drafter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib

Array = jax.Array


def leading_accepts(accept_BxG: Array) -> Array:
  """Length of each row's run of accepted drafts from the front."""
  return jnp.sum(jnp.cumprod(accept_BxG.astype(jnp.int32), axis=1), axis=1)


def _allowed(draft_BxG: Array, num_drafts_B: Array | None) -> Array:
  gamma = draft_BxG.shape[1]
  if num_drafts_B is None:
    return jnp.ones(draft_BxG.shape, bool)
  return jnp.arange(gamma)[None, :] < num_drafts_B[:, None]


def greedy(draft_BxG: Array, target_argmax_BxG1: Array,
           num_drafts_B: Array | None = None) -> tuple[Array, Array]:
  """Accept while the draft equals the target's argmax (its greedy token at each position,
  `ForwardOutput.argmax_BxR`); then take the argmax."""
  num_accepted_B = leading_accepts((draft_BxG == target_argmax_BxG1[:, :-1])
                                   & _allowed(draft_BxG, num_drafts_B))
  next_B = jnp.take_along_axis(target_argmax_BxG1, num_accepted_B[:, None], axis=1)[:, 0]
  return num_accepted_B, next_B


def speculative_sampling(draft_BxG: Array, draft_probs_BxGxV: Array | None,
                         target_probs_BxG1xV: Array, keys_B: Array,
                         num_drafts_B: Array | None = None) -> tuple[Array, Array]:
  """The exact rule. `draft_probs` None means a deterministic drafter (one-hot q).

  Probabilities must already carry temperature, top-k and top-p.
  """
  batch, gamma = draft_BxG.shape
  vocab = target_probs_BxG1xV.shape[-1]
  p_draft_BxG = jnp.take_along_axis(target_probs_BxG1xV[:, :gamma], draft_BxG[..., None],
                                    axis=-1)[..., 0]
  if draft_probs_BxGxV is None:
    q_draft_BxG = jnp.ones_like(p_draft_BxG)
  else:
    q_draft_BxG = jnp.take_along_axis(draft_probs_BxGxV, draft_BxG[..., None], axis=-1)[..., 0]

  accept_keys_B, residual_keys_B = _split_rows(keys_B)
  u_BxG = jax.vmap(lambda k: jax.random.uniform(k, (gamma,), jnp.float32))(accept_keys_B)
  # u < p / q without dividing: q > 0 wherever the drafter could draw d.
  accept_BxG = (u_BxG * q_draft_BxG < p_draft_BxG) & _allowed(draft_BxG, num_drafts_B)
  num_accepted_B = leading_accepts(accept_BxG)

  rows = jnp.arange(batch)
  p_next_BxV = target_probs_BxG1xV[rows, num_accepted_B]
  limit_B = gamma if num_drafts_B is None else num_drafts_B
  rejected_B = num_accepted_B < limit_B
  at_B = jnp.minimum(num_accepted_B, gamma - 1)
  if draft_probs_BxGxV is None:
    q_next_BxV = jax.nn.one_hot(draft_BxG[rows, at_B], vocab, dtype=p_next_BxV.dtype)
  else:
    q_next_BxV = draft_probs_BxGxV[rows, at_B]
  q_next_BxV = jnp.where(rejected_B[:, None], q_next_BxV, 0.0)  # bonus: q_gamma = 0
  residual_BxV = jnp.maximum(p_next_BxV - q_next_BxV, 0.0)
  empty_B = jnp.sum(residual_BxV, axis=-1) <= 0.0  # p == q: fall back to p
  residual_BxV = jnp.where(empty_B[:, None], p_next_BxV, residual_BxV)
  next_B = sampling_lib.sample(residual_keys_B, residual_BxV)
  return num_accepted_B, next_B


def _split_rows(keys_B: Array) -> tuple[Array, Array]:
  split = jax.vmap(jax.random.split)(keys_B)
  return split[:, 0], split[:, 1]
