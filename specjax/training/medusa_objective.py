"""What Medusa heads learn from: the target's features and its own next tokens.

One teacher-forced target pass over a batch of the target's own sequences
gives the final-norm hidden state h_t at every position; head k at position t
is trained to predict token t+2+k of the sequence (cross-entropy, Medusa-1's
weights 0.8^k). The sequences are the target's own greedy or sampled text, so
matching them is matching the target's distribution. Targets outside the draft
vocabulary cannot be drafted and are left out of the loss.

`accepted_run` measures what decoding would see: on greedy data, the draft of
head k at position t is accepted iff heads 0..k all predict their tokens, so
the mean run of correct heads plus one (the target's own token) is the mean
accepted tokens per verify call of a greedy chain verified at every position.
Decoding does not verify at every position: a call that accepts r drafts moves
r + 1 tokens on, so a streak the drafter gets right is one call, where the mean
over positions counts it at each of its positions, and each call starts where
the last chain failed. `served_order` walks each row that way; on the shipped
EAGLE drafter's held-out text it gives 2.05 tokens per call where the mean over
positions gives 2.52 (benchmarks/heldout_drafters.py), and the served figure
is the one Spec-Bench runs come near.

Shapes: B batch, L sequence, D width, K heads, N draft vocabulary, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax.drafters import medusa
from specjax.models.config import GemmaConfig

Array = jax.Array

HEAD_DECAY = 0.8   # Medusa-1's weight of head k: 0.8^k


def target_features(target, target_params, tokens_BxL: Array) -> Array:
  """The frozen target's final-norm hidden states at every position (no gradient)."""
  batch, length = tokens_BxL.shape
  positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  out = target.forward(target_params, tokens_BxL, positions_BxL,
                       target.init_cache(batch, max(length, 2)),
                       jnp.zeros((batch, 1), jnp.int32))  # the head at one position only
  return jax.lax.stop_gradient(out.hidden_BxTxD)


def draft_index(vocab_ids_N: Array | None, vocab: int) -> Array:
  """Token id -> its row in the draft vocabulary, -1 outside it: [V]."""
  if vocab_ids_N is None:
    return jnp.arange(vocab, dtype=jnp.int32)
  return jnp.full((vocab,), -1, jnp.int32).at[vocab_ids_N].set(
      jnp.arange(vocab_ids_N.shape[0], dtype=jnp.int32))


def frozen_table(target_params, vocab_ids_N: Array | None, vocab_size: int) -> dict[str, Array]:
  """What a drafter that shares the target's tied table trains against, frozen: the
  table, its draft-vocabulary rows (the head) and the V -> N index of the labels."""
  return {'embedding_VxD': target_params['embedding_VxD'],
          'head_NxD': medusa.head_matrix(target_params, vocab_ids_N),
          'index_V': draft_index(vocab_ids_N, vocab_size)}


def labels(tokens_BxL: Array, lengths_B: Array, index_V: Array, num_heads: int,
           starts_B: Array | None = None) -> tuple[Array, Array]:
  """Each head's target row at each position, and whether it counts: [B, L, K] each.
  A token before `starts_B` (a prompt's, not the target's) is not a label."""
  batch, length = tokens_BxL.shape
  t_L = jnp.arange(length)
  ahead_K = jnp.arange(num_heads) + 2
  where_LxK = t_L[:, None] + ahead_K[None, :]
  token_BxLxK = tokens_BxL[:, jnp.clip(where_LxK, 0, length - 1)]
  row_BxLxK = index_V[token_BxLxK]
  valid_BxLxK = (where_LxK[None] < lengths_B[:, None, None]) & (row_BxLxK >= 0)
  if starts_B is not None:
    valid_BxLxK &= where_LxK[None] >= starts_B[:, None, None]
  return jnp.maximum(row_BxLxK, 0), valid_BxLxK


def logits(heads, head_NxD: Array, hidden_BxLxD: Array, softcap: float | None) -> Array:
  batch, length, width = hidden_BxLxD.shape
  out = medusa.head_logits(heads, head_NxD, hidden_BxLxD.reshape(batch * length, width), softcap)
  return out.reshape(batch, length, *out.shape[1:])


def loss(heads, head_NxD: Array, hidden_BxLxD: Array, rows_BxLxK: Array, valid_BxLxK: Array,
         softcap: float | None = None) -> tuple[Array, dict[str, Array]]:
  """The weighted mean cross-entropy over heads, and per-head accuracy."""
  logits_BxLxKxN = logits(heads, head_NxD, hidden_BxLxD, softcap)
  logp = jax.nn.log_softmax(logits_BxLxKxN, axis=-1)
  nll_BxLxK = -jnp.take_along_axis(logp, rows_BxLxK[..., None], axis=-1)[..., 0]
  valid = valid_BxLxK.astype(jnp.float32)
  count_K = jnp.maximum(valid.sum(axis=(0, 1)), 1.0)
  nll_K = (nll_BxLxK * valid).sum(axis=(0, 1)) / count_K
  weights_K = HEAD_DECAY ** jnp.arange(nll_K.shape[0], dtype=jnp.float32)
  correct_BxLxK = (jnp.argmax(logits_BxLxKxN, axis=-1) == rows_BxLxK) & valid_BxLxK
  metrics = {'nll_K': nll_K, 'accuracy_K': correct_BxLxK.sum(axis=(0, 1)) / count_K,
             'correct_BxLxK': correct_BxLxK}
  return jnp.sum(weights_K * nll_K) / jnp.sum(weights_K), metrics


def run_lengths(correct_BxLxK: Array) -> Array:
  """How many drafts of the chain at each position are right before the first miss."""
  return jnp.sum(jnp.cumprod(correct_BxLxK.astype(jnp.int32), axis=-1), axis=-1)


def served_order(correct_NxLxK, lengths_N: np.ndarray, starts_N: np.ndarray | None
                 ) -> tuple[int, int]:
  """(tokens committed, verify calls) of greedy chains walked as decoding walks them:
  the chain at position t (the target's feature at t; token t + 1 known) commits its
  run of right drafts and the target's token after them, and the next chain is at
  t + run + 1. A row's first chain is at its last prompt position (the target wrote
  token `start`; position 0 for a row without a prompt); the walk stops where a
  chain's drafts would pass the row's end, as `accepted_run` counts."""
  depth = correct_NxLxK.shape[-1]
  run_NxL = np.asarray(run_lengths(jnp.asarray(correct_NxLxK)))
  tokens = calls = 0
  for i, run_L in enumerate(run_NxL):
    t = 0 if starts_N is None else max(int(starts_N[i]) - 1, 0)
    while t + depth + 1 < int(lengths_N[i]):
      accepted = int(run_L[t])
      tokens, calls, t = tokens + accepted + 1, calls + 1, t + accepted + 1
  return tokens, calls


def accepted_run(correct_BxLxK: Array, lengths_B: Array, starts_B: Array | None = None
                 ) -> tuple[Array, Array]:
  """(sum of runs of correct heads from head 0, positions counted), over positions
  where every head's token is inside the sequence and the target wrote the first
  one (a token outside the draft vocabulary counts as a miss, as it would in
  decoding)."""
  _, length, num_heads = correct_BxLxK.shape
  run_BxL = run_lengths(correct_BxLxK)
  full_BxL = (jnp.arange(length)[None, :] + num_heads + 1) < lengths_B[:, None]
  if starts_B is not None:
    full_BxL &= jnp.arange(length)[None, :] + 2 >= starts_B[:, None]
  return jnp.sum(jnp.where(full_BxL, run_BxL, 0)), jnp.sum(full_BxL)


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """Medusa-1's objective for `num_heads` heads on the target's final-norm output."""

  target: GemmaConfig
  num_heads: int
  kind: str = 'medusa'
  hidden_layers: tuple[int, ...] = ()   # the features are the final-norm output

  def init(self, rng: Array, target_params) -> dict[str, Array]:
    del rng, target_params
    return medusa.init_heads(self.num_heads, self.target.embed_dim)

  def frozen(self, target_params, vocab_ids_N: Array | None) -> dict[str, Array]:
    return {'head_NxD': medusa.head_matrix(target_params, vocab_ids_N),
            'index_V': draft_index(vocab_ids_N, self.target.vocab_size)}

  def loss(self, params, frozen, features_BxLxF: Array, tokens_BxL: Array, lengths_B: Array,
           starts_B: Array | None = None) -> tuple[Array, dict[str, Array]]:
    rows, valid = labels(tokens_BxL, lengths_B, frozen['index_V'], self.num_heads, starts_B)
    return loss(params, frozen['head_NxD'], features_BxLxF, rows, valid,
                self.target.final_logit_softcap)
