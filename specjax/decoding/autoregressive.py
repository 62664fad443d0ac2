"""Autoregressive decoding as one compiled program: the baseline.

Prefill and the whole decode loop are one jitted function: a `lax.while_loop`
over a fixed-shape state, one token per row per step, no host round-trip
until every row has hit EOS or its token budget. Every speculative method is
measured against this.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding import batch as batch_lib
from specjax.decoding import prefill as prefill_lib
from specjax.decoding import sampling as sampling_lib
from specjax.models.language_model import LanguageModel

Array = jax.Array


@flax.struct.dataclass
class DecodeState:
  tokens_BxS: Array   # committed tokens; the last one of each row is pending
  lengths_B: Array    # committed tokens per row
  num_new_B: Array
  done_B: Array
  cache: list
  step: Array


@dataclasses.dataclass
class Generation:
  """What one batch produced, for the active (non-padding) rows only."""

  new_tokens: list[list[int]]
  prompt_lengths: list[int]
  wall_s: float
  steps: int                 # loop iterations (target calls after prefill)

  @property
  def num_new_tokens(self) -> list[int]:
    return [len(t) for t in self.new_tokens]


def _decode_step(model, params, keys_B, max_new_B, sampling, eos_ids, state: DecodeState):
  rows = jnp.arange(state.tokens_BxS.shape[0])
  pending_Bx1 = state.tokens_BxS[rows, state.lengths_B - 1][:, None]
  logits_Bx1xV, cache = model.forward(params, pending_Bx1, (state.lengths_B - 1)[:, None],
                                      state.cache)
  keys = sampling_lib.step_keys(keys_B, state.step + 1)
  token_B = sampling_lib.next_token(keys, logits_Bx1xV[:, 0], sampling)
  live_B = ~state.done_B
  slot_B = jnp.where(live_B, state.lengths_B, state.lengths_B - 1)
  kept_B = jnp.where(live_B, token_B, state.tokens_BxS[rows, slot_B])
  tokens_BxS = state.tokens_BxS.at[rows, slot_B].set(kept_B)
  lengths_B = state.lengths_B + live_B
  num_new_B = state.num_new_B + live_B
  done_B = state.done_B | prefill_lib.is_stop(token_B, eos_ids) & live_B | (num_new_B >= max_new_B)
  return DecodeState(tokens_BxS, lengths_B, num_new_B, done_B, cache, state.step + 1)


@functools.partial(jax.jit, static_argnames=('model', 'sampling', 'prefill_len', 'eos_ids',
                                             'max_new_tokens'))
def generate_program(params, tokens_BxS, lengths_B, max_new_B, keys_B, active_B, *,
                     model: LanguageModel, sampling: sampling_lib.SamplingConfig,
                     prefill_len: int, eos_ids: tuple[int, ...], max_new_tokens: int):
  """The compiled program: prefill, first token, then a while_loop of decode steps."""
  batch, num_slots = tokens_BxS.shape
  cache = model.init_cache(batch, num_slots)
  logits_BxV, cache = prefill_lib.prefill(model, params, tokens_BxS, lengths_B, prefill_len, cache)
  tokens_BxS, lengths_B, first_B = prefill_lib.commit_first_token(
      tokens_BxS, lengths_B, logits_BxV, keys_B, sampling)
  num_new_B = jnp.ones_like(lengths_B)
  done_B = ~active_B | prefill_lib.is_stop(first_B, eos_ids) | (num_new_B >= max_new_B)
  state = DecodeState(tokens_BxS, lengths_B, num_new_B, done_B, cache, jnp.int32(0))

  def cond(s: DecodeState):
    return (s.step < max_new_tokens) & jnp.any(~s.done_B)

  body = functools.partial(_decode_step, model, params, keys_B, max_new_B, sampling, eos_ids)
  state = jax.lax.while_loop(cond, body, state)
  return state.tokens_BxS, state.num_new_B, state.step


def generate(model: LanguageModel, params, prompts: Sequence[Sequence[int]], *,
             max_new_tokens: int, sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
             eos_ids: Sequence[int] = (), seed: int = 0, row_ids: Sequence[int] | None = None,
             max_cache_len: int | None = None) -> Generation:
  """Generates for a batch of token-id prompts; rows may differ in length.

  `row_ids` name each row's rng stream (default: its index), so a row's
  sampled output does not depend on which batch it ran in.
  """
  max_slots = min(max_cache_len or model.config.max_position, model.config.max_position)
  packed = batch_lib.pack(prompts, max_new_tokens=max_new_tokens, extra_slots=1,
                          max_slots=max_slots,
                          row_ids=row_ids, rows_multiple=model.data_parallelism,
                          vocab_size=model.config.vocab_size)
  keys_B = sampling_lib.row_keys(seed, packed.row_ids_B)
  max_new_B = np.full(packed.lengths_B.shape, max_new_tokens, np.int32)
  start = time.perf_counter()
  tokens_BxS, num_new_B, steps = generate_program(
      params, packed.tokens_BxS, packed.lengths_B, max_new_B, keys_B, packed.active_B,
      model=model, sampling=sampling, prefill_len=packed.prefill_len,
      eos_ids=tuple(int(e) for e in eos_ids), max_new_tokens=max_new_tokens)
  tokens_BxS, num_new_B, steps = jax.device_get((tokens_BxS, num_new_B, steps))
  wall_s = time.perf_counter() - start
  return Generation(
      new_tokens=batch_lib.new_tokens(tokens_BxS, packed.lengths_B, num_new_B, packed.active_B),
      prompt_lengths=[len(p) for p in prompts], wall_s=wall_s, steps=int(steps))
