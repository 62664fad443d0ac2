"""What a step that verifies n drafts costs, relative to a decode step, measured.

The adaptive draft length (`draft_length.py`) weighs expected accepted tokens
against these costs, so they must be this device's and this batch size's: a
verify call over 5 positions costs about 1.6 decode steps on a 2-core AVX2
CPU at batch 1 and can cost several at batch 16. For a drafter with costly
drafts (a network per draft, `Drafter.costly_drafts`) a step's cost also
holds drafting its n tokens: the loop chooses the width before drafting, so
a plain step saves the draft too (an EAGLE layer on a 16k head is a few
hundredths of a decode step; the target's own layers with a small head more
than half of one). Each width is one jitted loop of calls over a cache of
the batch's shape (made once, then donated from run to run as the loop's
steps hand it on), timed after a compile-and-warm-up run: the minimum of a
few rounds, each round timing every program once in turn, so that a slow
spell of the machine (another process, a frequency change) falls on all of
them alike and not on one width alone. (Timed one program after the other, a
sweep's first measurement gave 1.58 decode steps for a call over 3 positions
and 1.59 over 5 at 896 cache slots; the same calls measured a few minutes
later gave 1.07 and 1.24, and a policy holding the first figures drafts too
little.) Drafting is timed from a state that the drafter's `init` made
from a prompt of distinct tokens: a network's cost depends on shapes, not on
values, and a hybrid (`drafters/hybrid.py`) finds no n-gram match in such a
prompt, so what is timed is its network, the costly source. (A zero prompt
matched everywhere, and a hybrid's drafting measured as free.)
"""

from __future__ import annotations

import functools
import time
from typing import Sequence

import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.drafters.base import Drafter, TargetView

_STEPS = 4   # forward calls per timed program
_REPEATS = 3


@functools.partial(jax.jit, static_argnames=('model', 'width', 'batch', 'num_slots'))
def _fresh_start(model, *, width: int, batch: int, num_slots: int):
  """A cache, and first tokens spread over the vocabulary (not one repeated id, see `_calls`)."""
  tokens_BxT = (jnp.arange(batch * width).reshape(batch, width) * 40503 + 1013
                ) % model.config.vocab_size
  return model.init_cache(batch, num_slots), tokens_BxT.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=('model', 'width', 'batch', 'num_slots', 'greedy'),
                   donate_argnames=('cache', 'tokens_BxT'))
def _calls(model, params, cache, tokens_BxT, *, width: int, batch: int, num_slots: int,
           greedy: bool):
  """`_STEPS` calls over `width` positions a row; each call reads the tokens the one before
  predicted, so that the model runs on its own text. Greedy's head argmax rescores the rows
  its first pass cannot rule out, and on a run of one token (id 0, padding) or on tokens
  drawn at random the logits are flat enough that hundreds to thousands are candidates: a
  cost that text does not have (the 270M's head on 10 positions of padding: 349 candidates
  each, against 6 at the median on raw Spec-Bench text)."""
  start = max(0, num_slots // 2 - _STEPS * width)

  def body(i, carry):
    cache, tokens_BxT, total = carry
    positions_BxT = jnp.broadcast_to(start + i * width + jnp.arange(width), (batch, width))
    out = model.forward(params, tokens_BxT, positions_BxT, cache, greedy=greedy)
    # Greedy: the argmax the loop takes (from the head's argmax kernel where it serves).
    # Sampled: one reduction over every logit, as the softmax makes (here their argmax, the
    # next tokens): at batch 16 and 5 positions that pass over 21M logits is a fifth of the
    # call on a CPU.
    predicted_BxT = (out.argmax_BxR if greedy else jnp.argmax(out.logits_BxRxV, axis=-1)
                     ).astype(jnp.int32)
    return out.cache, predicted_BxT, total + predicted_BxT.sum().astype(jnp.float32)

  return jax.lax.fori_loop(0, _STEPS, body, (cache, tokens_BxT, jnp.float32(0)))


class _Program:
  """A timed program that runs on a carry (the target's cache, a drafter's state) which each
  run donates to the next, as the loop's steps do. A cache made inside the timed program (36
  fresh arrays for the 270M) paid its page faults at every run: a few ms that made a 4-call
  program's wide calls look cheaper beside a decode step than they are."""

  def __init__(self, start, step):
    self.start, self.step, self.carry = start, step, None

  def __call__(self):
    if self.carry is None:
      self.carry = self.start()
    *carry, total = self.step(*self.carry)
    self.carry = tuple(carry)
    return total


def _call_run(model, params, width: int, *, batch: int, num_slots: int, greedy: bool):
  return _Program(
      lambda: _fresh_start(model, width=width, batch=batch, num_slots=num_slots),
      lambda cache, tokens_BxT: _calls(model, params, cache, tokens_BxT, width=width,
                                       batch=batch, num_slots=num_slots, greedy=greedy))


def seconds_per_call(model, params, width: int, *, batch: int, num_slots: int,
                     greedy: bool = False) -> float:
  """Seconds of one target call over `width` positions per row (best of a few), with the
  greedy loop's argmax or, by default, the sampled loop's pass over the logits."""
  return _best_of({'call': _call_run(model, params, width, batch=batch,
                                     num_slots=num_slots, greedy=greedy)})['call']


def _distinct_prompt(batch: int, num_slots: int, gamma: int, vocab_size: int | None):
  """Tokens 1, 2, 3, ... (no token repeats where the vocabulary allows) and each row's length."""
  tokens_S = jnp.arange(num_slots) % ((vocab_size or num_slots + 1) - 1) + 1
  return (jnp.broadcast_to(tokens_S, (batch, num_slots)).astype(jnp.int32),
          jnp.full((batch,), max(2, num_slots // 2 - gamma), jnp.int32))


@functools.partial(jax.jit, static_argnames=('drafter', 'model', 'gamma', 'batch', 'num_slots'))
def _draft_start(drafter: Drafter, model, drafter_params, params, *, gamma: int, batch: int,
                 num_slots: int):
  """The drafter's state from a prompt of distinct tokens, and the target's cache if it
  shares it."""
  prompt_len = max(1, min(16, num_slots // 2))
  cfg = model.config
  tokens_BxS, lengths_B = _distinct_prompt(batch, num_slots, gamma, drafter.vocab_size)
  layers = len(drafter.hidden_layers)
  target_kwargs = {'target_params': params} if drafter.reads_target_params else {}
  view = TargetView(
      tokens_BxS=tokens_BxS, lengths_B=lengths_B,
      positions_BxT=jnp.broadcast_to(jnp.arange(prompt_len), (batch, prompt_len)),
      hidden_BxTxD=jnp.zeros((batch, prompt_len, cfg.embed_dim), jnp.float32),
      layer_hidden_LxBxTxD=(jnp.zeros((layers, batch, prompt_len, cfg.embed_dim), jnp.float32)
                            if layers else None),
      num_accepted_B=jnp.zeros((batch,), jnp.int32),
      num_verified_B=jnp.zeros((batch,), jnp.int32))
  state = drafter.init(params=drafter_params, target=view, **target_kwargs)
  cache = model.init_cache(batch, num_slots) if drafter.shares_target_cache else None
  return state, cache


@functools.partial(jax.jit, static_argnames=('drafter', 'sampling', 'gamma', 'batch',
                                             'num_slots'),
                   donate_argnames=('state', 'cache'))
def _proposals(drafter: Drafter, drafter_params, params, state, cache, *, sampling, gamma: int,
               batch: int, num_slots: int):
  tokens_BxS, lengths_B = _distinct_prompt(batch, num_slots, gamma, drafter.vocab_size)
  target_kwargs = {'target_params': params} if drafter.reads_target_params else {}
  keys_B = jax.random.split(jax.random.key(0), batch)

  def body(i, carry):
    state, cache, total = carry
    proposal = drafter.propose(
        params=drafter_params, state=state, tokens_BxS=tokens_BxS, lengths_B=lengths_B,
        keys_B=sampling_lib.step_keys(keys_B, i), sampling=sampling, gamma=gamma,
        shared=(params, cache) if drafter.shares_target_cache else None, **target_kwargs)
    cache = proposal.shared_cache if drafter.shares_target_cache else cache
    return proposal.state, cache, total + proposal.draft_BxG.sum()

  return jax.lax.fori_loop(0, _STEPS, body, (state, cache, jnp.int32(0)))


def _best_of(runs: dict) -> dict:
  """Seconds per step of each program: warmed up (compiled) first, then the best of
  `_REPEATS` rounds that each time every program once, in turn."""
  for run in runs.values():
    run().block_until_ready()
  best = dict.fromkeys(runs, float('inf'))
  for _ in range(_REPEATS):
    for key, run in runs.items():
      start = time.perf_counter()
      run().block_until_ready()
      best[key] = min(best[key], time.perf_counter() - start)
  return {key: seconds / _STEPS for key, seconds in best.items()}


def seconds_per_draft(drafter: Drafter, model, params, gamma: int, *, batch: int,
                      num_slots: int,
                      sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig()
                      ) -> float:
  """Seconds of one `propose` of `gamma` drafts per row (best of a few)."""
  return _best_of({'draft': _draft_run(drafter, model, params, gamma, batch=batch,
                                       num_slots=num_slots, sampling=sampling)})['draft']


def _draft_run(drafter: Drafter, model, params, gamma: int, *, batch: int, num_slots: int,
               sampling: sampling_lib.SamplingConfig):
  return _Program(
      lambda: _draft_start(drafter, model, drafter.params, params, gamma=gamma, batch=batch,
                           num_slots=num_slots),
      lambda state, cache: _proposals(drafter, drafter.params, params, state, cache,
                                      sampling=sampling, gamma=gamma, batch=batch,
                                      num_slots=num_slots))


def measure(model, params, buckets: Sequence[int], *, batch: int, num_slots: int,
            drafter: Drafter | None = None,
            sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig()
            ) -> tuple[float, ...]:
  """Relative cost of a step verifying n drafts, for each n in `buckets` (n = 0,
  a plain step, is 1.0); with a `drafter` whose drafts are costly, drafting the
  n tokens included."""
  return measure_parts(model, params, buckets, batch=batch, num_slots=num_slots,
                       drafter=drafter, sampling=sampling)[0]


def measure_parts(model, params, buckets: Sequence[int], *, batch: int, num_slots: int,
                  drafter: Drafter | None = None,
                  sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig()
                  ) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """`measure`'s costs, and the part of each that is drafting (zeros for a drafter
  whose drafts are free): what the policy's `costs` and `draft_costs` hold."""
  drafts = drafter is not None and drafter.costly_drafts
  greedy = sampling.greedy
  runs = {('call', 1): _call_run(model, params, 1, batch=batch, num_slots=num_slots,
                                 greedy=greedy)}
  for n in buckets:
    if n:
      runs['call', n + 1] = _call_run(model, params, n + 1, batch=batch, num_slots=num_slots,
                                      greedy=greedy)
      if drafts:
        runs['draft', n] = _draft_run(drafter, model, params, n, batch=batch,
                                      num_slots=num_slots, sampling=sampling)
  seconds = _best_of(runs)
  base = seconds['call', 1]
  drafting = tuple(seconds['draft', n] / base if drafts and n else 0.0 for n in buckets)
  return (tuple(1.0 if n == 0 else max(1.0, seconds['call', n + 1] / base) + d
                for n, d in zip(buckets, drafting)), drafting)
