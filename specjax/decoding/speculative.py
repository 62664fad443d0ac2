"""Speculative decoding as one compiled program: draft, verify, accept, commit.

Each iteration of one `lax.while_loop`:
  1. the drafter proposes gamma tokens per row (with q, what they were drawn from);
  2. the target verifies them in ONE forward pass over gamma + 1 positions: the
     row's pending token (its last committed one, not yet in the cache) and the
     drafts, at the row's own positions L-1 .. L+gamma-1;
  3. the acceptance rule keeps each row's longest valid prefix and one more token
     (the correction, or the bonus token after full acceptance);
  4. the accepted tokens are committed (cut at EOS and at the token budget) and
     the drafter is updated with them.
Every row keeps its own length, so a row accepting 0 tokens never holds back a
row accepting gamma (no lockstep). KV entries the verify pass wrote past a
row's new length are stale; causal masking hides them and the next verify
overwrites them. No host round-trip until every row is done.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import time
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import acceptance
from specjax.decoding import batch as batch_lib
from specjax.decoding import prefill as prefill_lib
from specjax.decoding import sampling as sampling_lib
from specjax.drafters.base import Drafter
from specjax.models.language_model import LanguageModel

Array = jax.Array

_ACCEPT_STREAM = 1
_DRAFT_STREAM = 3


@flax.struct.dataclass
class SpecState:
  tokens_BxS: Array          # committed tokens; the last of each row is pending
  lengths_B: Array
  num_new_B: Array
  done_B: Array
  target_cache: list
  drafter_state: object
  step: Array
  target_calls_B: Array      # verify calls, plus the prefill call
  accepted_B: Array          # drafts accepted by the rule
  accepted_at_BxG: Array     # how often draft position i was accepted


@dataclasses.dataclass
class SpeculativeGeneration:
  """What one batch produced, for the active rows only (lists are per row)."""

  new_tokens: list[list[int]]
  prompt_lengths: list[int]
  wall_s: float
  steps: int
  gamma: int
  target_calls: list[int]
  drafted_tokens: list[int]
  accepted_tokens: list[int]
  accepted_at_position: list[list[int]]

  @property
  def num_new_tokens(self) -> list[int]:
    return [len(t) for t in self.new_tokens]


def check_drafter(drafter: Drafter, target: LanguageModel) -> None:
  if drafter.vocab_size is not None and drafter.vocab_size != target.config.vocab_size:
    raise ValueError(
        f'drafter {drafter.name!r} has a vocabulary of {drafter.vocab_size} tokens but the '
        f'target has {target.config.vocab_size}: a drafter must share the target\'s vocabulary')


def _commit(state: SpecState, block_BxG1: Array, count_B: Array) -> Array:
  """Writes each row's first `count` tokens of its block after its length."""
  batch, width = block_BxG1.shape
  rows = jnp.arange(batch)[:, None]
  slots_BxG1 = state.lengths_B[:, None] + jnp.arange(width)[None, :]
  existing_BxG1 = state.tokens_BxS[rows, slots_BxG1]
  keep_BxG1 = jnp.arange(width)[None, :] < count_B[:, None]
  return state.tokens_BxS.at[rows, slots_BxG1].set(jnp.where(keep_BxG1, block_BxG1, existing_BxG1))


def _spec_step(target: LanguageModel, drafter: Drafter, gamma: int,
               sampling: sampling_lib.SamplingConfig, eos_ids: tuple[int, ...],
               target_params, drafter_params, keys_B, max_new_B, state: SpecState) -> SpecState:
  batch = state.tokens_BxS.shape[0]
  rows = jnp.arange(batch)
  draft_keys = sampling_lib.step_keys(keys_B, state.step + 1, _DRAFT_STREAM)
  draft_BxG, q_BxGxV, drafter_state, target_cache = drafter.propose(
      drafter_params, state.drafter_state, state.tokens_BxS, state.lengths_B, draft_keys,
      sampling, gamma, target_params, state.target_cache)

  pending_B = state.tokens_BxS[rows, state.lengths_B - 1]
  verify_BxG1 = jnp.concatenate([pending_B[:, None], draft_BxG], axis=1)
  positions_BxG1 = state.lengths_B[:, None] - 1 + jnp.arange(gamma + 1)[None, :]
  logits_BxG1xV, target_cache = target.forward(target_params, verify_BxG1, positions_BxG1,
                                               target_cache)

  if sampling.greedy:
    num_accepted_B, next_B = acceptance.greedy(draft_BxG, logits_BxG1xV)
  else:
    p_BxG1xV = sampling_lib.probabilities(logits_BxG1xV, sampling)
    accept_keys = sampling_lib.step_keys(keys_B, state.step + 1, _ACCEPT_STREAM)
    num_accepted_B, next_B = acceptance.speculative_sampling(draft_BxG, q_BxGxV, p_BxG1xV,
                                                             accept_keys)

  # The block to commit: accepted drafts, then the correction or bonus token.
  block_BxG1 = jnp.concatenate([draft_BxG, jnp.zeros((batch, 1), jnp.int32)], axis=1)
  block_BxG1 = block_BxG1.at[rows, num_accepted_B].set(next_B)
  live_B = ~state.done_B
  stop_BxG1 = prefill_lib.is_stop(block_BxG1, eos_ids)
  stop_BxG1 &= jnp.arange(gamma + 1)[None, :] <= num_accepted_B[:, None]
  first_stop_B = jnp.where(jnp.any(stop_BxG1, axis=1), jnp.argmax(stop_BxG1, axis=1), gamma + 1)
  count_B = jnp.minimum(jnp.minimum(num_accepted_B + 1, first_stop_B + 1),
                        max_new_B - state.num_new_B)
  count_B = jnp.where(live_B, count_B, 0)

  tokens_BxS = _commit(state, block_BxG1, count_B)
  lengths_B = state.lengths_B + count_B
  num_new_B = state.num_new_B + count_B
  done_B = state.done_B | (live_B & (first_stop_B < count_B)) | (num_new_B >= max_new_B)
  drafter_state = drafter.update(drafter_params, drafter_state, tokens_BxS, lengths_B)

  live_i = live_B.astype(jnp.int32)
  accepted_at_BxG = state.accepted_at_BxG + live_i[:, None] * (
      jnp.arange(gamma)[None, :] < num_accepted_B[:, None])
  return SpecState(tokens_BxS, lengths_B, num_new_B, done_B, target_cache, drafter_state,
                   state.step + 1, state.target_calls_B + live_i,
                   state.accepted_B + live_i * num_accepted_B, accepted_at_BxG)


@functools.partial(jax.jit, static_argnames=('target', 'drafter', 'gamma', 'sampling',
                                             'prefill_len', 'eos_ids', 'max_new_tokens'))
def speculative_program(target_params, drafter_params, tokens_BxS, lengths_B, max_new_B, keys_B,
                        active_B, *, target: LanguageModel, drafter: Drafter, gamma: int,
                        sampling: sampling_lib.SamplingConfig, prefill_len: int,
                        eos_ids: tuple[int, ...], max_new_tokens: int):
  batch, num_slots = tokens_BxS.shape
  target_cache = target.init_cache(batch, num_slots)
  drafter_state = drafter.init(drafter_params, tokens_BxS, lengths_B, prefill_len, target_cache)
  logits_BxV, target_cache = prefill_lib.prefill(target, target_params, tokens_BxS, lengths_B,
                                                 prefill_len, target_cache)
  tokens_BxS, lengths_B, first_B = prefill_lib.commit_first_token(
      tokens_BxS, lengths_B, logits_BxV, keys_B, sampling)
  drafter_state = drafter.update(drafter_params, drafter_state, tokens_BxS, lengths_B)
  num_new_B = jnp.ones_like(lengths_B)
  done_B = ~active_B | prefill_lib.is_stop(first_B, eos_ids) | (num_new_B >= max_new_B)
  ones_B = active_B.astype(jnp.int32)
  state = SpecState(tokens_BxS, lengths_B, num_new_B, done_B, target_cache, drafter_state,
                    jnp.int32(0), ones_B, jnp.zeros_like(ones_B),
                    jnp.zeros((batch, gamma), jnp.int32))

  def cond(s: SpecState):
    return (s.step < max_new_tokens) & jnp.any(~s.done_B)

  body = functools.partial(_spec_step, target, drafter, gamma, sampling, eos_ids, target_params,
                           drafter_params, keys_B, max_new_B)
  state = jax.lax.while_loop(cond, body, state)
  return (state.tokens_BxS, state.num_new_B, state.step, state.target_calls_B, state.accepted_B,
          state.accepted_at_BxG)


def generate(target: LanguageModel, target_params, drafter: Drafter,
             prompts: Sequence[Sequence[int]], *, gamma: int, max_new_tokens: int,
             sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
             eos_ids: Sequence[int] = (), seed: int = 0, row_ids: Sequence[int] | None = None,
             max_cache_len: int | None = None) -> SpeculativeGeneration:
  """Speculative generation for a batch of token-id prompts of any lengths.

  The output is distributed exactly as `autoregressive.generate`'s (identical
  for greedy decoding); rows use the same rng streams (`row_ids`) as there for
  the first token, and their own streams for drafting and acceptance.
  """
  if isinstance(gamma, bool) or not isinstance(gamma, numbers.Integral) or gamma < 1:
    raise ValueError(f'gamma must be an integer >= 1, got {gamma!r}')
  gamma = int(gamma)
  check_drafter(drafter, target)
  max_slots = min(max_cache_len or target.config.max_position, target.config.max_position)
  packed = batch_lib.pack(prompts, max_new_tokens=max_new_tokens, extra_slots=gamma + 1,
                          max_slots=max_slots, row_ids=row_ids,
                          rows_multiple=target.data_parallelism,
                          vocab_size=target.config.vocab_size)
  keys_B = sampling_lib.row_keys(seed, packed.row_ids_B)
  max_new_B = np.full(packed.lengths_B.shape, max_new_tokens, np.int32)
  start = time.perf_counter()
  out = speculative_program(
      target_params, drafter.params, packed.tokens_BxS, packed.lengths_B, max_new_B, keys_B,
      packed.active_B, target=target, drafter=drafter, gamma=gamma, sampling=sampling,
      prefill_len=packed.prefill_len, eos_ids=tuple(int(e) for e in eos_ids),
      max_new_tokens=max_new_tokens)
  tokens_BxS, num_new_B, steps, calls_B, accepted_B, accepted_at_BxG = jax.device_get(out)
  wall_s = time.perf_counter() - start
  active = packed.active_B
  verify_calls = [int(c) - 1 for c in calls_B[active]]
  return SpeculativeGeneration(
      new_tokens=batch_lib.new_tokens(tokens_BxS, packed.lengths_B, num_new_B, active),
      prompt_lengths=[len(p) for p in prompts], wall_s=wall_s, steps=int(steps), gamma=gamma,
      target_calls=[int(c) for c in calls_B[active]],
      drafted_tokens=[gamma * c for c in verify_calls],
      accepted_tokens=[int(a) for a in accepted_B[active]],
      accepted_at_position=[row.tolist() for row in accepted_at_BxG[active]])
