"""Self-speculation (LayerSkip-style): the target's first k layers draft.

The drafter is the target truncated after layer k, then the final norm and the
tied head. It shares the target's weights and the KV cache of those k layers
(`shares_target_cache`): the target's verify pass rewrites every slot the
drafter wrote (the pending token and the drafts, positions L-1 .. L+gamma-2)
with the full model's own values, so sharing needs no copy and leaves no stale
entry below a row's committed length. Each draft step is one truncated forward
of one token; its evidence is its run of drafts at least `min_confidence`
likely.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.drafters import confidence
from specjax.models.language_model import LanguageModel


@dataclasses.dataclass(frozen=True)
class Settings:
  """layers: target layers the drafter runs.
  min_confidence: drafts less likely than this under the drafter end its evidence."""

  layers: int = 4
  min_confidence: float = 0.0

  def __post_init__(self):
    if self.layers < 1:
      raise ValueError(f'layers must be >= 1, got {self.layers}')
    if not 0.0 <= self.min_confidence < 1.0:
      raise ValueError(f'min_confidence must be in [0, 1), got {self.min_confidence}')


def make(target: LanguageModel, settings: Settings = Settings()) -> base.Drafter:
  num_layers = settings.layers
  if not 1 <= num_layers < target.config.num_layers:
    raise ValueError(f'config.early_exit.layers must be in [1, {target.config.num_layers - 1}] '
                     f'for this target, got {num_layers}')

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del params
    target_params, target_cache = shared
    rows = jnp.arange(tokens_BxS.shape[0])
    pending_B = tokens_BxS[rows, lengths_B - 1]

    def step(carry, i):
      cache, token_B = carry
      out = target.forward(target_params, token_B[:, None], (lengths_B - 1 + i)[:, None], cache,
                           num_layers=num_layers)
      logits_BxV = out.logits_BxRxV[:, 0]
      new_B, q_BxV = sampling_lib.draw(sampling_lib.step_keys(keys_B, i), logits_BxV, sampling)
      prob_B = confidence.draft_probability(logits_BxV, new_B)
      return (out.cache, new_B), (new_B, q_BxV, prob_B)

    (target_cache, _), (draft_GxB, q_GxBxV, prob_GxB) = jax.lax.scan(
        step, (target_cache, pending_B), jnp.arange(gamma))
    q_BxGxV = None if q_GxBxV is None else q_GxBxV.transpose(1, 0, 2)
    num_drafts_B = confidence.confident_prefix(prob_GxB.T, settings.min_confidence)
    return base.Proposal(draft_GxB.T, q_BxGxV, num_drafts_B, state, shared_cache=target_cache)

  return base.Drafter(name='early_exit', vocab_size=target.config.vocab_size,
                      init=base.no_state_init, update=base.no_state_update, propose=propose,
                      shares_target_cache=True)
