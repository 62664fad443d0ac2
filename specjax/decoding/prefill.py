"""The prologue both decoding loops share: prefill, the first token, the loop state.

Autoregressive and speculative decoding start from the same cache and the same
first token (drawn from the target with the row's step-0 key): after it, the
row's last committed token is the one "pending" token whose keys and values
are not yet in the cache. `commit` is the one place tokens are appended.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.models.gemma import ForwardOutput

Array = jax.Array


@flax.struct.dataclass
class DecodeState:
  tokens_BxS: Array   # committed tokens; the last one of each row is pending
  lengths_B: Array    # committed tokens per row
  num_new_B: Array
  done_B: Array
  cache: list
  step: Array


def is_stop(token_B: Array, eos_ids: tuple[int, ...]) -> Array:
  stop = jnp.zeros(token_B.shape, bool)
  for eos in eos_ids:
    stop |= token_B == eos
  return stop


def start(model, params, tokens_BxS: Array, lengths_B: Array, max_new_B: Array, keys_B: Array,
          active_B: Array, *, prefill_len: int, sampling: sampling_lib.SamplingConfig,
          eos_ids: tuple[int, ...], hidden_layers: tuple[int, ...] = ()
          ) -> tuple[DecodeState, ForwardOutput]:
  """Writes the prompts' KV, draws each row's first token; returns the loop's first
  state and the prefill's ForwardOutput (hidden states at every prompt position)."""
  batch, num_slots = tokens_BxS.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(prefill_len, dtype=jnp.int32), (batch, prefill_len))
  out = model.forward(params, tokens_BxS[:, :prefill_len], positions_BxT,
                      model.init_cache(batch, num_slots), (lengths_B - 1)[:, None],
                      hidden_layers=hidden_layers, greedy=sampling.greedy)
  if sampling.greedy:
    first_B = out.argmax_BxR[:, 0]
  else:
    first_B, _ = sampling_lib.draw(sampling_lib.step_keys(keys_B, 0), out.logits_BxRxV[:, 0],
                                   sampling)
  tokens_BxS = tokens_BxS.at[jnp.arange(batch), lengths_B].set(first_B)
  num_new_B = jnp.ones_like(lengths_B)
  done_B = ~active_B | is_stop(first_B, eos_ids) | (num_new_B >= max_new_B)
  state = DecodeState(tokens_BxS, lengths_B + 1, num_new_B, done_B, out.cache, jnp.int32(0))
  return state, out


def still_running(max_new_B: Array):
  """The decode loops' `while_loop` condition on a DecodeState: some row is unfinished.

  The step count is capped at the largest row budget, which is data (one compiled
  program serves every budget); it is a bound only, as each step commits a token to
  every live row.
  """
  max_steps = jnp.max(max_new_B)
  return lambda state: (state.step < max_steps) & jnp.any(~state.done_B)


def commit(state: DecodeState, block_BxW: Array, usable_B: Array, max_new_B: Array,
           eos_ids: tuple[int, ...], cache) -> tuple[DecodeState, Array]:
  """Appends each live row's first `usable` tokens of its block, cut after an EOS
  and at the token budget; returns the new state and the count committed."""
  batch, width = block_BxW.shape
  rows = jnp.arange(batch)[:, None]
  live_B = ~state.done_B
  in_block_BxW = jnp.arange(width)[None, :] < usable_B[:, None]
  stop_BxW = is_stop(block_BxW, eos_ids) & in_block_BxW
  first_stop_B = jnp.where(jnp.any(stop_BxW, axis=1), jnp.argmax(stop_BxW, axis=1), width)
  count_B = jnp.minimum(jnp.minimum(usable_B, first_stop_B + 1), max_new_B - state.num_new_B)
  count_B = jnp.where(live_B, count_B, 0)

  slots_BxW = state.lengths_B[:, None] + jnp.arange(width)[None, :]
  keep_BxW = jnp.arange(width)[None, :] < count_B[:, None]
  existing_BxW = state.tokens_BxS[rows, slots_BxW]
  tokens_BxS = state.tokens_BxS.at[rows, slots_BxW].set(
      jnp.where(keep_BxW, block_BxW, existing_BxW))
  num_new_B = state.num_new_B + count_B
  done_B = state.done_B | (live_B & (first_stop_B < count_B)) | (num_new_B >= max_new_B)
  return DecodeState(tokens_BxS, state.lengths_B + count_B, num_new_B, done_B, cache,
                     state.step + 1), count_B
