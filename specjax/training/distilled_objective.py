"""What a distilled draft model learns from: the target's next-token distribution (DistillSpec).

The student is a small model of the target's own architecture: the target's
first `layers` blocks and its final norm, copied as the starting point
(LayerSkip's early exit, which on its own accepts almost nothing on Gemma 3
270M), then trained; it shares the target's tied embedding, frozen, so it
carries no 262,144-row table of its own. It drafts through the draft
vocabulary's rows of that table (N of V), as the EAGLE drafter does.

At every position of the target's own text, teacher-forced, the loss compares
the target's distribution p with the student's q, both over the draft
vocabulary (p renormalised on it: decoding never drafts outside it):

  'kl'  forward KL(p || q), DistillSpec's FKL;
  'tv'  total variation 1/2 sum |p - q|, which is 1 minus the acceptance
        rate of a draft from q against p (Leviathan et al.), so minimising it
        is maximising acceptance directly (DistillSpec's TVD).

p comes from the target's final-norm hidden state (the trainer's features)
through the same rows of the frozen head, so nothing V-wide is computed.

`correct_BxLxK` is the student's greedy chain checked against the target's
text: after the pending token x_{t+1}, draft k is right when the student's
argmax at position t+1+k is x_{t+k+2}, Medusa's labels; teacher-forced, so the
chain is what the drafter would draft while every draft so far was right.

Shapes: B batch, L sequence, D width, K chain, N draft vocabulary, V vocabulary.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.drafters import draft_vocab
from specjax.models.config import GemmaConfig
from specjax.models.language_model import LanguageModel
from specjax.training import medusa_objective

Array = jax.Array

LOSSES = ('kl', 'tv')


def student_config(target: GemmaConfig, layers: int) -> GemmaConfig:
  """The student's architecture: the target's, cut to its first `layers` blocks."""
  if not 1 <= layers < target.num_layers:
    raise ValueError(f'a distilled student has 1 .. {target.num_layers - 1} layers (the target '
                     f'has {target.num_layers}), got {layers}')
  return target.truncated(layers)


def student_init(target_params, layers: int) -> dict[str, Array]:
  """The target's first `layers` blocks and its final norm (copies; the embedding is shared)."""
  weights = {f'layer_{i}': target_params[f'layer_{i}'] for i in range(layers)}
  weights['final_norm'] = target_params['final_norm']
  return jax.tree.map(jnp.array, weights)


def student_params(weights, embedding_VxD: Array) -> dict[str, Array]:
  """A full parameter tree of the student model: its weights and the target's table."""
  return {**weights, 'embedding_VxD': embedding_VxD}


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """DistillSpec's objective for a `layers`-block student of `target`."""

  target: GemmaConfig
  layers: int
  loss_kind: str = 'tv'
  steps: int = 4             # the chain the held-out figure scores
  kind: str = 'distilled'
  hidden_layers: tuple[int, ...] = ()   # the features are the target's final-norm output

  def __post_init__(self):
    student_config(self.target, self.layers)
    if self.loss_kind not in LOSSES:
      raise ValueError(f"config.distilled.loss must be one of {', '.join(LOSSES)}, "
                       f'got {self.loss_kind!r}')

  @property
  def student(self) -> LanguageModel:
    return LanguageModel(student_config(self.target, self.layers))

  def init(self, rng: Array, target_params) -> dict[str, Array]:
    del rng   # the student starts as the target's first blocks
    return student_init(target_params, self.layers)

  def frozen(self, target_params, vocab_ids_N: Array | None) -> dict[str, Array]:
    return medusa_objective.frozen_table(target_params, vocab_ids_N, self.target.vocab_size)

  def logits(self, head_NxD: Array, hidden_BxLxD: Array) -> Array:
    batch, length, width = hidden_BxLxD.shape
    flat = draft_vocab.head_logits(head_NxD, hidden_BxLxD.reshape(batch * length, width),
                                   self.target)
    return flat.reshape(batch, length, -1)

  def loss(self, params, frozen, features_BxLxF: Array, tokens_BxL: Array, lengths_B: Array,
           starts_B: Array | None = None) -> tuple[Array, dict[str, Array]]:
    batch, length = tokens_BxL.shape
    student = self.student
    positions_BxL = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    out = student.forward(student_params(params, frozen['embedding_VxD']), tokens_BxL,
                          positions_BxL, student.init_cache(batch, max(length, 2)), logits=False)
    logq_BxLxN = jax.nn.log_softmax(self.logits(frozen['head_NxD'], out.hidden_BxTxD), axis=-1)
    logp_BxLxN = jax.lax.stop_gradient(
        jax.nn.log_softmax(self.logits(frozen['head_NxD'], features_BxLxF), axis=-1))
    if self.loss_kind == 'kl':
      per_BxL = jnp.sum(jnp.exp(logp_BxLxN) * (logp_BxLxN - logq_BxLxN), axis=-1)
    else:
      per_BxL = 0.5 * jnp.sum(jnp.abs(jnp.exp(logp_BxLxN) - jnp.exp(logq_BxLxN)), axis=-1)
    valid_BxL = (jnp.arange(length)[None, :] < lengths_B[:, None]).astype(jnp.float32)
    loss = jnp.sum(per_BxL * valid_BxL) / jnp.maximum(valid_BxL.sum(), 1.0)

    # Draft k after chain t's pending token: the argmax at t + 1 + k, scored on x_{t+k+2}.
    rows_BxLxK, valid_BxLxK = medusa_objective.labels(tokens_BxL, lengths_B, frozen['index_V'],
                                                      self.steps, starts_B)
    guess_BxL = jnp.argmax(logq_BxLxN, axis=-1)
    at_LxK = jnp.clip(jnp.arange(length)[:, None] + 1 + jnp.arange(self.steps)[None, :], 0,
                      length - 1)
    correct_BxLxK = (guess_BxL[:, at_LxK] == rows_BxLxK) & valid_BxLxK
    count_K = jnp.maximum(valid_BxLxK.sum(axis=(0, 1)), 1)
    return loss, {'accuracy_K': correct_BxLxK.sum(axis=(0, 1)) / count_K,
                  'correct_BxLxK': correct_BxLxK}
