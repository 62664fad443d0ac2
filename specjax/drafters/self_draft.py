"""Self-speculation: the target itself, cut short, drafts (early exit, layer skipping).

The drafter runs the target with some layers left out: all after the first k
(`early_exit`, LayerSkip-style) or a chosen set (`layer_skip`, Draft & Verify /
SWIFT), then the final norm and a head. It shares the target's weights and
the KV cache of the layers it runs (`shares_target_cache`): the target's
verify pass rewrites every slot the drafter wrote (the pending token and the
drafts, positions L-1 .. L+gamma-2) with the full model's own values, so
sharing needs no copy and leaves no stale entry below a row's committed
length; a layer the drafter leaves out is neither read nor written. Each draft
step is one cut-short forward of one token; its evidence is its run of drafts
at least `min_confidence` likely.

The head is the full tied one, or a reduced draft vocabulary
(`draft_vocab.py`): then the drafter's params are the N gathered rows of the
tied table and their ids, and no V-wide product is computed in a draft step.

Shape letters: B batch, S token slots, G gamma, D width, N draft vocabulary,
V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.drafters import base
from specjax.drafters import confidence
from specjax.drafters import draft_vocab as draft_vocab_lib
from specjax.models.language_model import LanguageModel


def head_params(vocab: draft_vocab_lib.DraftVocab | None, target_params, setting: str):
  """The drafter's params: None for the full head, else {head_NxD, ids_N}."""
  if vocab is None:
    return None
  if target_params is None:
    raise ValueError(f'config.{setting} needs the target params to gather its head from '
                     '(make_drafter(..., target_params=...))')
  ids_N = jnp.asarray(vocab.ids_N, jnp.int32)
  head_NxD, head_q8 = draft_vocab_lib.head_rows(target_params, ids_N)
  return dict(head_NxD=head_NxD, head_q8=head_q8, ids_N=ids_N)


def make(target: LanguageModel, *, name: str, num_layers: int | None = None,
         skip_layers: tuple[int, ...] = (), min_confidence: float = 0.0,
         vocab: draft_vocab_lib.DraftVocab | None = None, target_params=None,
         vocab_setting: str = 'draft_vocab') -> base.Drafter:
  config = target.config
  params = head_params(vocab, target_params, f'{name}.{vocab_setting}')

  def step_logits(params, out):
    if params is None:
      return out.logits_BxRxV[:, 0], None
    return draft_vocab_lib.head_logits(params['head_NxD'], out.hidden_BxTxD[:, 0], config,
                                       params['head_q8']), params['ids_N']

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    target_params, target_cache = shared
    rows = jnp.arange(tokens_BxS.shape[0])
    pending_B = tokens_BxS[rows, lengths_B - 1]

    def step(carry, i):
      cache, token_B = carry
      out = target.forward(target_params, token_B[:, None], (lengths_B - 1 + i)[:, None], cache,
                           num_layers=num_layers, skip_layers=skip_layers,
                           logits=params is None)
      logits_BxN, ids_N = step_logits(params, out)
      keys = sampling_lib.step_keys(keys_B, i)
      new_B, index_B, q_BxV = draft_vocab_lib.draw(keys, logits_BxN, ids_N, config.vocab_size,
                                                   sampling)
      prob_B = confidence.draft_probability(logits_BxN, index_B)
      return (out.cache, new_B), (new_B, q_BxV, prob_B)

    (target_cache, _), (draft_GxB, q_GxBxV, prob_GxB) = jax.lax.scan(
        step, (target_cache, pending_B), jnp.arange(gamma))
    q_BxGxV = None if q_GxBxV is None else q_GxBxV.transpose(1, 0, 2)
    num_drafts_B = confidence.confident_prefix(prob_GxB.T, min_confidence)
    return base.Proposal(draft_GxB.T, q_BxGxV, num_drafts_B, state, shared_cache=target_cache)

  return base.Drafter(name=name, vocab_size=config.vocab_size, init=base.no_state_init,
                      update=base.no_state_update, propose=propose, params=params,
                      shares_target_cache=True, costly_drafts=True)
