"""Autoregressive decoding as one compiled program: the baseline.

Prefill and the whole decode loop are one jitted function: a `lax.while_loop`
over a fixed-shape state, one token per row per step, no host round-trip
until every row has hit EOS or its token budget. Every speculative method is
measured against this, and the speculative loop takes exactly this
`decode_step` when no row has a draft worth verifying.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.decoding import batch as batch_lib
from specjax.decoding import prefill as prefill_lib
from specjax.decoding import program as program_lib
from specjax.decoding.prefill import DecodeState
from specjax.models.gemma import ForwardOutput
from specjax.models.language_model import LanguageModel

Array = jax.Array

_ACCEPT_STREAM = 0  # the stream a plain step's token is drawn from


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


def decode_step(model, params, keys_B: Array, max_new_B: Array, loop: program_lib.Loop,
                state: DecodeState, hidden_layers: tuple[int, ...] = ()
                ) -> tuple[DecodeState, ForwardOutput]:
  """One target call on each row's pending token, and the token it yields."""
  rows = jnp.arange(state.tokens_BxS.shape[0])
  pending_Bx1 = state.tokens_BxS[rows, state.lengths_B - 1][:, None]
  greedy = loop.sampling.greedy
  out = model.forward(params, pending_Bx1, (state.lengths_B - 1)[:, None], state.cache,
                      hidden_layers=hidden_layers, greedy=greedy)
  if greedy:
    token_B = out.argmax_BxR[:, 0]
  else:
    keys = sampling_lib.step_keys(keys_B, state.step + 1, _ACCEPT_STREAM)
    token_B, _ = sampling_lib.draw(keys, out.logits_BxRxV[:, 0], loop.sampling)
  state, _ = prefill_lib.commit(state, token_B[:, None], jnp.ones_like(token_B), max_new_B,
                                loop.eos_ids, out.cache)
  return state, out


def program(loop: program_lib.Loop, params, drafter_params, data, tokens_BxS, lengths_B,
            max_new_B, keys_B, active_B):
  """Prefill, first token, then a while_loop of decode steps."""
  del drafter_params, data
  model = loop.target
  state, _ = prefill_lib.start(model, params, tokens_BxS, lengths_B, max_new_B, keys_B, active_B,
                               prefill_len=loop.prefill_len, sampling=loop.sampling,
                               eos_ids=loop.eos_ids)

  def body(s: DecodeState):
    return decode_step(model, params, keys_B, max_new_B, loop, s)[0]

  state = jax.lax.while_loop(prefill_lib.still_running(max_new_B), body, state)
  return dict(tokens_BxS=state.tokens_BxS, num_new_B=state.num_new_B, steps=state.step)


def generate(model: LanguageModel, params, prompts: Sequence[Sequence[int]] | batch_lib.PromptBatch,
             *, max_new_tokens: int,
             sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
             eos_ids: Sequence[int] = (), seed: int = 0, row_ids: Sequence[int] | None = None,
             max_cache_len: int | None = None, warm_up: bool = False) -> Generation:
  """Generates for a batch of token-id prompts (or a batch packed once by
  `program.pack`); rows may differ in length.

  `row_ids` name each row's rng stream (default: its index), so a row's
  sampled output does not depend on which batch it ran in. `warm_up` compiles
  and runs the program generating one token per row (`program.run`).
  """
  packed = program_lib.pack(model, prompts, max_new_tokens=max_new_tokens, extra_slots=1,
                            row_ids=row_ids, max_cache_len=max_cache_len)
  loop = program_lib.Loop(target=model, sampling=sampling, eos_ids=tuple(int(e) for e in eos_ids),
                          prefill_len=packed.prefill_len)
  out, wall_s = program_lib.run(program, loop, params, None, packed,
                                max_new_tokens=max_new_tokens, seed=seed, warm_up=warm_up)
  return Generation(
      new_tokens=batch_lib.new_tokens(out['tokens_BxS'], packed.lengths_B, out['num_new_B'],
                                      packed.active_B),
      prompt_lengths=packed.prompt_lengths, wall_s=wall_s, steps=int(out['steps']))
