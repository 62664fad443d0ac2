"""What the EAGLE drafter learns from: EAGLE-3's training-time test on the target's text.

The data is the target's own sequences with, at every position, the target's
residual stream at the fused layers (one teacher-forced pass, computed once
per run by the trainer). Step 1 of chain t reads the fused target feature at
t and token x_{t+1} and is scored on x_{t+2}; step j reads step j-1's output
(not the target's feature: this is the training-time test, which makes the
layer learn to continue from its own predictions, as it must when it drafts)
and x_{t+j}, and is scored on x_{t+j+1}, attending to the keys drafting would
find in its cache (`eagle_net.unrolled`). Steps are weighted 0.8^(j-1), as
Medusa-1 weights heads; targets outside the draft vocabulary are left out of
the loss (decoding cannot draft them). The target's embedding and head are
frozen; only the layer trains.

With `soft_labels` = J > 0 a step is scored on the target's own distribution
over the next token instead of the one token the sequence holds: the J most
likely rows of the draft vocabulary under the target at that position,
renormalized (`SoftLabels`, computed in the same teacher-forced pass as the
features). That is knowledge distillation: each position teaches the whole
ranking, not one sample of it, and on the sampled shards the drafter learns
the target's likeliest token (what greedy verification accepts) rather than
the token a temperature-1 draw happened to pick. Accuracy and the held-out
figure still count the sequence's own tokens.

`correct_BxLxK` (step k's guess right at chain t) feeds the same held-out
mean-accepted-tokens figure as Medusa's: a chain of K drafts accepted while
every step so far was right.

Shapes: B batch, L sequence, F fused feature width (layers x D), D width,
K steps, N draft vocabulary, V vocabulary, J soft labels per position.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specjax.drafters import eagle_net
from specjax.models.config import GemmaConfig
from specjax.training import medusa_objective

Array = jax.Array

STEP_DECAY = 0.8


class SoftLabels(NamedTuple):
  """The target's next-token distribution at each position (the token after it), cut
  to its J likeliest draft-vocabulary rows and renormalized over them."""

  rows_BxLxJ: Array    # int32 rows of the draft vocabulary
  probs_BxLxJ: Array   # float32, summing to 1 over J


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """EAGLE-3's objective for a layer reading `hidden_layers` of `target`."""

  target: GemmaConfig
  hidden_layers: tuple[int, ...]
  steps: int                 # training-time-test depth: drafts ahead it is scored on
  mlp_width: int
  kind: str = 'eagle'
  window: int | None = None  # keys farther back than this are not attended to
  soft_labels: int = 0       # J: score on the target's J likeliest tokens (0: the sequence's)

  def init(self, rng: Array, target_params) -> dict[str, Array]:
    return eagle_net.init_params(self.target, len(self.hidden_layers), self.mlp_width, rng,
                                 final_norm_D=target_params['final_norm']['scale'])

  def frozen(self, target_params, vocab_ids_N: Array | None) -> dict[str, Array]:
    return medusa_objective.frozen_table(target_params, vocab_ids_N, self.target.vocab_size)

  def loss(self, params, frozen, features_BxLxF: Array, tokens_BxL: Array, lengths_B: Array,
           starts_B: Array | None = None, soft: SoftLabels | None = None
           ) -> tuple[Array, dict[str, Array]]:
    if (soft is None) != (self.soft_labels == 0):
      raise ValueError(f'the objective scores on {self.soft_labels or "no"} soft labels, '
                       f'and was given {"none" if soft is None else "some"}')
    geo = eagle_net.Geometry.of(params, self.target.rms_norm_eps, self.window)
    batch, length = tokens_BxL.shape
    num_fused = len(self.hidden_layers)
    layers_LxBxTxD = jnp.moveaxis(
        features_BxLxF.reshape(batch, length, num_fused, -1), 2, 0)
    first_BxLxD = eagle_net.fuse(params, layers_LxBxTxD)
    # Chain t reads x_{t+1}: the embedded sequence shifted left by one.
    embedded_BxLxD = jnp.roll(eagle_net.embed(frozen['embedding_VxD'], tokens_BxL), -1, axis=1)
    outs = eagle_net.unrolled(params, geo, first_BxLxD, embedded_BxLxD, self.steps)
    # Step k (0-based) at chain t is scored on x_{t+k+2}: Medusa's labels for head k.
    rows_BxLxK, valid_BxLxK = medusa_objective.labels(tokens_BxL, lengths_B, frozen['index_V'],
                                                      self.steps, starts_B)
    nll, correct = [], []
    for k, out_BxLxD in enumerate(outs):
      logits_BxLxN = eagle_net.logits(params, frozen['head_NxD'], out_BxLxD, self.target,
                                      geo.eps)
      logp = jax.nn.log_softmax(logits_BxLxN, axis=-1)
      rows = rows_BxLxK[..., k]
      if soft is None:
        nll.append(-jnp.take_along_axis(logp, rows[..., None], axis=-1)[..., 0])
      else:  # x_{t+k+2} follows position t+k+1: the target's distribution there
        at_L = jnp.clip(jnp.arange(length) + k + 1, 0, length - 1)
        logq_BxLxJ = jnp.take_along_axis(logp, soft.rows_BxLxJ[:, at_L], axis=-1)
        nll.append(-jnp.sum(soft.probs_BxLxJ[:, at_L] * logq_BxLxJ, axis=-1))
      correct.append(jnp.argmax(logits_BxLxN, axis=-1) == rows)
    nll_BxLxK = jnp.stack(nll, axis=-1)
    valid = valid_BxLxK.astype(jnp.float32)
    count_K = jnp.maximum(valid.sum(axis=(0, 1)), 1.0)
    nll_K = (nll_BxLxK * valid).sum(axis=(0, 1)) / count_K
    correct_BxLxK = jnp.stack(correct, axis=-1) & valid_BxLxK
    weights_K = STEP_DECAY ** jnp.arange(self.steps, dtype=jnp.float32)
    metrics = {'nll_K': nll_K, 'accuracy_K': correct_BxLxK.sum(axis=(0, 1)) / count_K,
               'correct_BxLxK': correct_BxLxK}
    return jnp.sum(weights_K * nll_K) / jnp.sum(weights_K), metrics
