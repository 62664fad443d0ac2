"""N-gram lookup first, a network drafter where it finds nothing (hybrid drafting).

Prompt lookup is free and, where the text repeats its context (summaries,
retrieval answers, code edits), right for many tokens at once; a trained
drafter (EAGLE, Medusa) or the target cut short costs a network pass per
draft but guesses everywhere. The hybrid drafts each row from its n-gram
match when it has one and from the network drafter when it has none, as
REST and Spec-Bench's "PLD + EAGLE" combinations do, and runs the network
only in a step where some row lacks a match: at batch 1 a step that copies
costs nothing to draft.

The network drafter keeps its own state and is updated after every target
call, so it must read a call as a whole, whatever drafted it: EAGLE writes
its keys over the call's positions from the target's features, Medusa reads
the hidden state at the accepted count, the self-drafters share the target's
cache, which the verify pass rewrites, and a draft model (the distilled one)
feeds its own cache every token the call committed (`draft_model.py`).

Which source drafts a matched row is `choose`'s: 'lookup' (the default)
takes the match whenever there is one; 'history' keeps, per row, a decayed
acceptance history of each source (`draft_length.History`, from the verified
and accepted counts of the calls it drafted) and takes the match only while
lookup's estimated acceptance is at least the network's. Both estimates start
at the same prior, so a row tries lookup first and moves to the network when
its copies keep failing; an unused source's counts decay back towards the
prior, so it is tried again. 'history' is the rule for a network that guesses
better than short copies do; with the shipped EAGLE on raw-text Spec-Bench it
ran 1.52x against 'lookup''s 1.64x (26 prompts, one run, 4 December 2026): it
moved rows to drafts that were accepted less often (2.08 against 2.20 tokens
per call) and cost a network pass.

The hybrid has the network's costly drafts: the loop chooses the call's width
from each row's acceptance history first and then drafts only that many
tokens, so a plain step runs neither lookup nor the network (drafting first,
as n-gram lookup alone does, ran the network in every step: a never-drafting
loop cost 1.47 decode steps a step against EAGLE's own 1.15,
benchmarks/plain_step_overhead.py, 6 December 2026). Each row then verifies
at most its evidence: gamma for a row drafted by lookup, the network
drafter's own (its confident prefix) otherwise.

Before that choice the hybrid `plan`s: it looks up each row's match (cheap)
and tells the loop which rows will run the network and each row's
acceptance rate for its own source, so a step that only copies is weighed at
the cost of verifying alone and by lookup's record, and a step that runs the
network at the cost of drafting too and by the network's record. With one
history and one cost table the loop weighed both sources alike: a copy that
costs nothing to draft, and an EAGLE draft, of which 4 cost 0.24-0.31 of a
decode step on a 2-core Xeon, accepted less often (`decoding/draft_length.py`). Under sampling a lookup row's q is one-hot at
its drafts, the network drafter's q elsewhere, so the acceptance rule stays
exact (the choice of source depends only on past calls).

Shapes: B batch, S token slots, G gamma, N tree nodes, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from specjax.decoding import draft_length
from specjax.drafters import base
from specjax.drafters import candidate_tree
from specjax.drafters import ngram as ngram_lib

Array = jax.Array

# Drafters whose update reads a target call whole, so they can draft after n-gram drafts.
FALLBACKS = ('eagle', 'medusa', 'draft_model', 'layer_skip', 'early_exit')
CHOICES = ('lookup', 'history')
# The prior and the decay of each source's acceptance history: the loop's defaults,
# each row on its own (the choice is per row: lookup may fail on one row's text and
# not on another's).
_HISTORY = dataclasses.replace(draft_length.fixed(1), pool_rows=False)


@dataclasses.dataclass(frozen=True)
class Settings:
  """drafter: what drafts a row n-gram lookup finds no match for, one of FALLBACKS,
    built from its own config entry (config.eagle for 'eagle').
  max_n, min_n: the longest and shortest suffix looked up, as config.ngram's.
  matches: for a token tree, the n-gram occurrences that fill its branches.
  choose: which source drafts a row that has a match: 'lookup' (always lookup)
    or 'history' (the one whose acceptance history for this row is better)."""

  drafter: str = 'eagle'
  max_n: int = 3
  min_n: int = 1
  matches: int = 4
  choose: str = 'lookup'

  def __post_init__(self):
    if self.drafter not in FALLBACKS:
      raise ValueError(f'drafter is {self.drafter!r}; a hybrid falls back to one of '
                       f'{", ".join(FALLBACKS)}')
    if self.choose not in CHOICES:
      raise ValueError(f'choose is {self.choose!r}; one of {", ".join(CHOICES)}')
    ngram_lib.Settings(self.max_n, self.min_n, self.matches)   # the same checks

  @property
  def ngram(self) -> ngram_lib.Settings:
    return ngram_lib.Settings(self.max_n, self.min_n, self.matches)


def _run_if(needed, run, placeholder):
  """run() when `needed` (a traced bool), else `placeholder`: a while loop of 0 or 1
  iterations, which on XLA:CPU updates the drafter's cache in place where
  `lax.cond` copies it in and out (`decoding/speculative._select`)."""
  return jax.lax.while_loop(lambda c: c[0], lambda c: (jnp.bool_(False), run()),
                            (needed, placeholder))[1]


def _lookup_q(draft_BxG: Array, network_q_BxGxV: Array) -> Array:
  """q of lookup drafts under sampling: one-hot, as for n-gram lookup alone (a
  deterministic draft), never the network's q, which did not draw them."""
  return jax.nn.one_hot(draft_BxG, network_q_BxGxV.shape[-1], dtype=network_q_BxGxV.dtype)


def _zeros_like(shapes):
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)


def _network_if(needed, network, network_state, shared):
  """network()'s proposal in a step where some row `needed` it; else zeros of its
  shapes carrying the network's unchanged state and the target's cache."""
  skipped = _zeros_like(jax.eval_shape(network)).replace(
      state=network_state, shared_cache=None if shared is None else shared[1])
  return _run_if(needed, network, skipped)


@flax.struct.dataclass
class State:
  """The network drafter's state, which source drafted each row's last proposal
  (lookup_B), and each source's acceptance history for each row."""

  network: Any
  lookup_B: jax.Array
  lookup_history: draft_length.History
  network_history: draft_length.History


def make(settings: Settings, fallback: base.Drafter) -> base.Drafter:
  """The hybrid of n-gram lookup (`settings`) and a built `fallback` drafter."""
  if fallback.name not in FALLBACKS:
    raise ValueError(f'a hybrid cannot fall back to {fallback.name!r}; it takes one of '
                     f'{", ".join(FALLBACKS)}')
  lookup = settings.ngram

  def init(*, params, target: base.TargetView, **target_params):
    batch = target.lengths_B.shape[0]
    return State(fallback.init(params=params, target=target, **target_params),
                 jnp.zeros((batch,), bool), draft_length.History.init(batch),
                 draft_length.History.init(batch))

  def update(*, params, state: State, target: base.TargetView, **target_params):
    """Each source's history gets the calls it drafted (a plain step verified
    nothing and counts for neither); the network reads every call."""
    verified_B, accepted_B = target.num_verified_B, target.num_accepted_B
    by_lookup_B = state.lookup_B
    return State(
        fallback.update(params=params, state=state.network, target=target, **target_params),
        by_lookup_B,
        state.lookup_history.record(_HISTORY, jnp.where(by_lookup_B, verified_B, 0),
                                    jnp.where(by_lookup_B, accepted_B, 0)),
        state.network_history.record(_HISTORY, jnp.where(by_lookup_B, 0, verified_B),
                                     jnp.where(by_lookup_B, 0, accepted_B)))

  def use_lookup(state: State, matched_B):
    """Rows that take their n-gram match rather than the network's drafts."""
    if settings.choose == 'lookup':
      return matched_B
    return matched_B & (state.lookup_history.acceptance(_HISTORY)
                        >= state.network_history.acceptance(_HISTORY))

  def plan(*, params, state: State, tokens_BxS, lengths_B):
    del params
    _, matched_B = ngram_lib.propose_ngram(tokens_BxS, lengths_B, 1, lookup.max_n, lookup.min_n)
    by_lookup_B = use_lookup(state, matched_B > 0)
    acceptance_B = jnp.where(by_lookup_B, state.lookup_history.acceptance(_HISTORY),
                             state.network_history.acceptance(_HISTORY))
    return base.Plan(acceptance_B, ~by_lookup_B)

  def propose(*, params, state: State, tokens_BxS, lengths_B, keys_B, sampling, gamma,
              shared=None, **target):
    ngram_BxG, matched_B = ngram_lib.propose_ngram(tokens_BxS, lengths_B, gamma, lookup.max_n,
                                                   lookup.min_n)
    by_lookup_B = use_lookup(state, matched_B > 0)

    def network():
      return fallback.propose(params=params, state=state.network, tokens_BxS=tokens_BxS,
                              lengths_B=lengths_B, keys_B=keys_B, sampling=sampling,
                              gamma=gamma, shared=shared, **target)

    net = _network_if(~jnp.all(by_lookup_B), network, state.network, shared)
    draft_BxG = jnp.where(by_lookup_B[:, None], ngram_BxG, net.draft_BxG)
    q_BxGxV = net.q_BxGxV
    if q_BxGxV is not None:
      q_BxGxV = jnp.where(by_lookup_B[:, None, None], _lookup_q(ngram_BxG, q_BxGxV), q_BxGxV)
    num_drafts_B = jnp.where(by_lookup_B, gamma, net.num_drafts_B).astype(jnp.int32)
    return base.Proposal(draft_BxG, q_BxGxV, num_drafts_B,
                         state.replace(network=net.state, lookup_B=by_lookup_B),
                         net.shared_cache)

  def propose_tree(*, params, state: State, tokens_BxS, lengths_B, keys_B, sampling, tree,
                   shared=None, **target):
    candidates_BxMxD, found_BxM = ngram_lib.candidates(
        tokens_BxS, lengths_B, tree.max_depth, lookup.max_n, lookup.min_n, lookup.matches)
    ngram_BxN, ngram_valid_BxN = candidate_tree.fill(tree, candidates_BxMxD, found_BxM)
    by_lookup_B = use_lookup(state, jnp.any(found_BxM, axis=1))

    def network():
      return fallback.propose_tree(params=params, state=state.network, tokens_BxS=tokens_BxS,
                                   lengths_B=lengths_B, keys_B=keys_B, sampling=sampling,
                                   tree=tree, shared=shared, **target)

    net = _network_if(~jnp.all(by_lookup_B), network, state.network, shared)
    if net.q_BxNxV is not None:   # both fill siblings with distinct ranked tokens
      raise ValueError(f'{fallback.name} samples its tree nodes; a hybrid tree needs '
                       'deterministic siblings')
    pick = by_lookup_B[:, None]
    return base.TreeProposal(jnp.where(pick, ngram_BxN, net.tokens_BxN), None,
                             jnp.where(pick, ngram_valid_BxN, net.valid_BxN),
                             state.replace(network=net.state, lookup_B=by_lookup_B),
                             net.shared_cache)

  return dataclasses.replace(
      fallback, name='hybrid', init=init, update=update, propose=propose,
      propose_tree=propose_tree if fallback.propose_tree is not None else None,
      costly_drafts=fallback.costly_drafts, plan=plan if fallback.costly_drafts else None)
