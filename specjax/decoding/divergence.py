"""Explaining a greedy speculative output that differs from the baseline.

Greedy speculative decoding must reproduce greedy autoregressive decoding. A
batched verify pass and one-token decode steps reduce in different orders, so
an exact numerical tie between the top two logits can still flip; a bug shows
as a difference where the target's margin is large. Reporting the margin at
the first differing position tells the two apart.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

from specjax.models.language_model import LanguageModel


@dataclasses.dataclass(frozen=True)
class Divergence:
  position: int            # index into the generated tokens
  baseline_token: int
  speculative_token: int
  logit_margin: float      # target's top-1 minus top-2 logit there


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return None if len(a) == len(b) else min(len(a), len(b))


def explain(model: LanguageModel, params, prompt: Sequence[int], baseline: Sequence[int],
            speculative: Sequence[int]) -> Divergence | None:
  """None when the outputs are identical; else where and by how much they split."""
  at = first_difference(baseline, speculative)
  if at is None:
    return None
  context = list(prompt) + list(baseline[:at])
  length = len(context)
  logits_1xRxV = model.forward(params, jnp.asarray([context], jnp.int32),
                               jnp.arange(length, dtype=jnp.int32)[None],
                               model.init_cache(1, length), jnp.asarray([[length - 1]])
                               ).logits_BxRxV
  top2 = jax.lax.top_k(logits_1xRxV[0, 0], 2)[0]
  pick = lambda seq: int(seq[at]) if at < len(seq) else -1  # noqa: E731  (-1: ended early)
  return Divergence(position=at, baseline_token=pick(baseline),
                    speculative_token=pick(speculative),
                    logit_margin=float(top2[0] - top2[1]))
