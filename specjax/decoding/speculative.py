"""Speculative decoding as one compiled program: draft, verify, accept, commit.

Each iteration of one `lax.while_loop`:
  1. the drafter proposes gamma tokens per row (with q, what they were drawn
     from, and how many of them the row has evidence for);
  2. the draft-length policy picks the call's width (a static bucket, each a
     branch of the program, `_select`) and each row's draft count
     (`draft_length.py`, aware of which rows set the batch's finishing time); for a
     drafter with costly drafts (a network per draft) it picks first, from
     acceptance history and measured costs, and the drafter proposes only
     that many, so a plain step drafts nothing;
  3. the target verifies them in ONE forward pass over n + 1 positions: the
     row's pending token (its last committed one, not yet in the cache) and
     the drafts, at the row's own positions L-1 .. L+n-1; with n = 0 this is
     exactly the autoregressive `decode_step`;
  4. the acceptance rule keeps each row's longest valid prefix and one more token
     (the correction, or the bonus token after full acceptance);
  5. the accepted tokens are committed (cut at EOS and at the token budget) and
     the drafter is updated with them and the target's hidden states.
Every row keeps its own length, so a row accepting 0 tokens never holds back a
row accepting gamma (no lockstep). KV entries the verify pass wrote past a
row's new length are stale; causal masking hides them and the next call
overwrites them. No host round-trip until every row is done.

With a static token tree (`Loop.tree`, `tree.py`) steps 1-4 verify the whole
tree in one call instead, and commit its accepted path (`tree_verify.py`).

Counters, per row: `target_calls` counts the prefill and every verify or plain
call; `drafted` counts the drafts verified and `accepted` those accepted, both
only up to where the block was cut: drafts past an EOS or past the token
budget count as neither, so accepted <= drafted and accepted <= new tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Sequence

import flax
import jax
import jax.numpy as jnp

from specjax import sampling as sampling_lib
from specjax.decoding import acceptance
from specjax.decoding import autoregressive
from specjax.decoding import batch as batch_lib
from specjax.decoding import draft_length
from specjax.decoding import prefill as prefill_lib
from specjax.decoding import program as program_lib
from specjax.decoding import tree_verify
from specjax.decoding.tree import Tree
from specjax.decoding.prefill import DecodeState
from specjax.drafters.base import Drafter, TargetView
from specjax.models.language_model import LanguageModel

Array = jax.Array

_ACCEPT_STREAM = 1
_DRAFT_STREAM = 3


@flax.struct.dataclass
class Counters:
  target_calls_B: Array      # verify or plain calls, plus the prefill call
  plain_calls_B: Array       # calls that verified no draft of this row
  drafted_B: Array           # drafts verified (up to a cut)
  accepted_B: Array          # drafts accepted (up to a cut)
  accepted_at_BxG: Array     # how often draft position i was accepted
  width_calls_N: Array       # loop steps that took each branch (a bucket; a tree: plain, tree)

  @classmethod
  def zeros(cls, batch: int, gamma: int, num_branches: int) -> Counters:
    zeros_B = jnp.zeros((batch,), jnp.int32)
    return cls(zeros_B, zeros_B, zeros_B, zeros_B, jnp.zeros((batch, gamma), jnp.int32),
               jnp.zeros((num_branches,), jnp.int32))


@flax.struct.dataclass
class SpecState:
  decode: DecodeState
  drafter_state: object
  history: draft_length.History
  counters: Counters


@dataclasses.dataclass
class SpeculativeGeneration:
  """What one batch produced, for the active rows only (lists are per row)."""

  new_tokens: list[list[int]]
  prompt_lengths: list[int]
  wall_s: float
  steps: int
  gamma: int
  target_calls: list[int]
  plain_calls: list[int]
  drafted_tokens: list[int]
  accepted_tokens: list[int]
  accepted_at_position: list[list[int]]
  width_calls: list[int]     # the batch's steps per branch: per bucket, or (plain, tree)

  @property
  def num_new_tokens(self) -> list[int]:
    return [len(t) for t in self.new_tokens]


def check_drafter(drafter: Drafter, target: LanguageModel) -> None:
  if drafter.vocab_size is not None and drafter.vocab_size != target.config.vocab_size:
    raise ValueError(
        f'drafter {drafter.name!r} has a vocabulary of {drafter.vocab_size} tokens but the '
        f'target has {target.config.vocab_size}: a drafter must share the target\'s vocabulary')
  bad = [i for i in drafter.hidden_layers if not 0 <= i < target.config.num_layers]
  if bad:
    raise ValueError(f'drafter {drafter.name!r} reads hidden layers {bad}, but the target has '
                     f'{target.config.num_layers} layers')


def target_kwargs(drafter: Drafter, target_params) -> dict:
  """`target_params=` for a drafter that reads them, nothing for the others."""
  return {'target_params': target_params} if drafter.reads_target_params else {}


def _pad_positions(x, width: int, axis: int):
  if x is None or x.shape[axis] == width:
    return x
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, width - x.shape[axis])
  return jnp.pad(x, pad)


@flax.struct.dataclass
class _Branch:
  """What one branch of a step reads and writes, as a while-loop carry (`_select`):
  the decode state whose cache the call extends, the drafter's state, each row's
  draft cap k_B, and the call's results (placeholders until a branch runs)."""

  decode: DecodeState
  drafter_state: object
  k_B: Array
  view: TargetView
  drafted_B: Array
  accepted_B: Array
  num_accepted_B: Array


def _select(index, branches, carry: _Branch) -> _Branch:
  """branches[index](carry), as one while loop of 0 or 1 iterations per branch.

  `lax.switch` and `lax.cond` on XLA:CPU copy every operand a branch updates
  into and out of it, the KV cache included: at batch 16 over 384 slots that is
  226 MB each way, and a step that verified nothing cost 1.3 decode steps. A
  while loop updates its carry in place, so a step costs what its branch does.
  Each branch maps the carry to a carry; exactly one runs.
  """
  if len(branches) == 1:
    return branches[0](carry)
  for n, branch in enumerate(branches):
    carry = jax.lax.while_loop(lambda c: c[0], lambda c, branch=branch: (jnp.bool_(False),
                                                                         branch(c[1])),
                               (index == n, carry))[1]
  return carry


def _placeholders(branch, carry: _Branch) -> _Branch:
  """The carry a step's branches start from: its results zero, shaped as `branch`'s."""
  shapes = jax.eval_shape(branch, carry)
  zeros = lambda x: None if x is None else jnp.zeros(x.shape, x.dtype)  # noqa: E731
  return carry.replace(view=jax.tree.map(zeros, shapes.view),
                       drafted_B=zeros(shapes.drafted_B), accepted_B=zeros(shapes.accepted_B),
                       num_accepted_B=zeros(shapes.num_accepted_B))


def _call(loop: program_lib.Loop, num_drafts: int, target_params, keys_B, max_new_B,
          decode: DecodeState, draft_BxG, q_BxGxV, k_B):
  """One target call verifying `num_drafts` (static) drafts per row, capped at k_B,
  extending `decode`'s cache.

  Returns the new decode state, the drafter's view of the call, and the
  per-row (drafted, accepted) counts up to the cut.
  """
  target, drafter, gamma = loop.target, loop.drafter, loop.gamma
  batch = draft_BxG.shape[0]
  rows = jnp.arange(batch)
  if num_drafts == 0:
    new, out = autoregressive.decode_step(target, target_params, keys_B, max_new_B, loop, decode,
                                          drafter.hidden_layers)
    num_accepted_B = jnp.zeros((batch,), jnp.int32)
    k_B = num_accepted_B
    count_B = new.num_new_B - decode.num_new_B
  else:
    n = num_drafts
    draft_BxN = draft_BxG[:, :n]
    k_B = jnp.minimum(k_B, n)
    pending_B = decode.tokens_BxS[rows, decode.lengths_B - 1]
    verify_BxN1 = jnp.concatenate([pending_B[:, None], draft_BxN], axis=1)
    positions_BxN1 = decode.lengths_B[:, None] - 1 + jnp.arange(n + 1)[None, :]
    out = target.forward(target_params, verify_BxN1, positions_BxN1, decode.cache,
                         hidden_layers=drafter.hidden_layers, greedy=loop.sampling.greedy)
    accept_keys = sampling_lib.step_keys(keys_B, decode.step + 1, _ACCEPT_STREAM)
    if loop.sampling.greedy:
      num_accepted_B, next_B = acceptance.greedy(draft_BxN, out.argmax_BxR, k_B)
    else:
      p_BxN1xV = sampling_lib.probabilities(out.logits_BxRxV, loop.sampling)
      q_BxNxV = None if q_BxGxV is None else q_BxGxV[:, :n]
      num_accepted_B, next_B = acceptance.speculative_sampling(draft_BxN, q_BxNxV, p_BxN1xV,
                                                               accept_keys, k_B)
    # The block to commit: accepted drafts, then the correction or bonus token.
    block_BxN1 = jnp.concatenate([draft_BxN, jnp.zeros((batch, 1), jnp.int32)], axis=1)
    block_BxN1 = block_BxN1.at[rows, num_accepted_B].set(next_B)
    new, count_B = prefill_lib.commit(decode, block_BxN1, num_accepted_B + 1, max_new_B,
                                      loop.eos_ids, out.cache)

  positions_BxG1 = decode.lengths_B[:, None] - 1 + jnp.arange(gamma + 1)[None, :]
  view = TargetView(tokens_BxS=new.tokens_BxS, lengths_B=new.lengths_B,
                    positions_BxT=positions_BxG1,
                    hidden_BxTxD=_pad_positions(out.hidden_BxTxD, gamma + 1, axis=1),
                    layer_hidden_LxBxTxD=_pad_positions(out.layer_hidden_LxBxTxD, gamma + 1,
                                                        axis=2),
                    num_accepted_B=num_accepted_B, num_verified_B=k_B)
  # Up to the cut: the committed block's drafts, and the drafts before it.
  usable_B = jnp.where(count_B < num_accepted_B + 1, count_B, gamma + 1)
  drafted_B = jnp.minimum(k_B, usable_B)
  accepted_B = jnp.minimum(num_accepted_B, count_B)
  return new, view, drafted_B, accepted_B, num_accepted_B, k_B


def _drafted_call(loop: program_lib.Loop, num_drafts: int, propose_kwargs, target_params, keys_B,
                  max_new_B, carry: _Branch) -> _Branch:
  """Drafts `num_drafts` (static) tokens per row, then verifies them (0 drafts
  nothing: a plain step). The branch of a drafter with costly drafts, whose width
  was chosen before drafting; each row verifies at most carry.k_B, and at most as
  many as it has evidence for."""
  drafter, decode, k_B = loop.drafter, carry.decode, carry.k_B
  drafter_state = carry.drafter_state
  if num_drafts == 0:
    draft_BxN = jnp.zeros((decode.lengths_B.shape[0], 0), jnp.int32)
    q_BxNxV = None
  else:
    shared = (target_params, decode.cache) if drafter.shares_target_cache else None
    proposal = drafter.propose(gamma=num_drafts, **dict(propose_kwargs, state=drafter_state,
                                                        shared=shared))
    k_B = jnp.minimum(k_B, jnp.clip(proposal.num_drafts_B, 0, num_drafts)).astype(jnp.int32)
    draft_BxN, q_BxNxV, drafter_state = proposal.draft_BxG, proposal.q_BxGxV, proposal.state
    decode = _after_drafting(drafter, decode, proposal)
  new, view, drafted_B, accepted_B, num_accepted_B, k_B = _call(
      loop, num_drafts, target_params, keys_B, max_new_B, decode, draft_BxN, q_BxNxV, k_B)
  return _Branch(new, drafter_state, k_B, view, drafted_B, accepted_B, num_accepted_B)


def _after_drafting(drafter: Drafter, decode, proposal):
  """The decode state a call verifies from: a drafter that shares the target's
  cache (self-drafting) hands back the cache it wrote its drafts' keys into."""
  return decode.replace(cache=proposal.shared_cache) if drafter.shares_target_cache else decode


def _verify_branch(loop: program_lib.Loop, num_drafts: int, target_params, keys_B, max_new_B,
                   proposal, carry: _Branch) -> _Branch:
  """Verifies `num_drafts` (static) of an existing proposal's drafts per row."""
  new, view, drafted_B, accepted_B, num_accepted_B, k_B = _call(
      loop, num_drafts, target_params, keys_B, max_new_B, carry.decode, proposal.draft_BxG,
      proposal.q_BxGxV, carry.k_B)
  return _Branch(new, carry.drafter_state, k_B, view, drafted_B, accepted_B, num_accepted_B)


def _tree_step(loop: program_lib.Loop, target_params, keys_B, max_new_B, state: SpecState,
               propose_kwargs) -> tuple[Array, _Branch]:
  """Verify the whole tree, or take a plain step when no live row has a valid node."""
  proposal = tree_verify.propose(loop.drafter, loop.tree, **propose_kwargs)
  decode = _after_drafting(loop.drafter, state.decode, proposal)
  any_valid = jnp.any(jnp.any(proposal.valid_BxN, axis=1) & ~decode.done_B)

  def tree_call(carry: _Branch) -> _Branch:
    new, view, drafted_B, accepted_B, num_accepted_B, k_B = tree_verify.call(
        loop, loop.tree, target_params, keys_B, max_new_B, carry.decode, proposal,
        carry.decode.cache, _ACCEPT_STREAM)
    return _Branch(new, carry.drafter_state, k_B, view, drafted_B, accepted_B, num_accepted_B)

  def plain_call(carry: _Branch) -> _Branch:
    new, view, drafted_B, accepted_B, num_accepted_B, k_B = _call(
        loop, 0, target_params, keys_B, max_new_B, carry.decode, proposal.tokens_BxN, None,
        carry.k_B)
    return _Branch(new, carry.drafter_state, k_B, view, drafted_B, accepted_B, num_accepted_B)

  carry = _Branch(decode, proposal.state, jnp.zeros(decode.lengths_B.shape, jnp.int32),
                  None, None, None, None)
  branches = [plain_call, tree_call]
  index = any_valid.astype(jnp.int32)
  return index, _select(index, branches, _placeholders(tree_call, carry))


def _step(loop: program_lib.Loop, target_params, drafter_params, costs, keys_B, max_new_B,
          state: SpecState) -> SpecState:
  drafter, policy, gamma = loop.drafter, loop.policy, loop.gamma
  decode = state.decode
  draft_keys = sampling_lib.step_keys(keys_B, decode.step + 1, _DRAFT_STREAM)
  shared = (target_params, decode.cache) if drafter.shares_target_cache else None
  live_B = ~decode.done_B
  remaining_B = max_new_B - decode.num_new_B
  propose_kwargs = dict(params=drafter_params, state=state.drafter_state,
                        tokens_BxS=decode.tokens_BxS, lengths_B=decode.lengths_B,
                        keys_B=draft_keys, sampling=loop.sampling, shared=shared,
                        **target_kwargs(drafter, target_params))
  if loop.tree is not None:
    index, out = _tree_step(loop, target_params, keys_B, max_new_B, state, propose_kwargs)
  elif drafter.costly_drafts and policy.adaptive:
    # Choose the width from history alone, then draft only that many.
    gamma_B = jnp.full(live_B.shape, gamma, jnp.int32)
    costs_N, acceptance_B = costs['total_N'], None
    if drafter.plan is not None:   # each row's source: a step no row drafts costly is cheaper
      plan = drafter.plan(params=drafter_params, state=state.drafter_state,
                          tokens_BxS=decode.tokens_BxS, lengths_B=decode.lengths_B)
      acceptance_B = plan.acceptance_B
      costs_N = jnp.where(jnp.any(plan.costly_B & live_B), costs_N,
                          costs_N - costs['drafting_N'])
    index, k_B = draft_length.choose(policy, costs_N, state.history, gamma_B, live_B,
                                     remaining_B, acceptance_B)
    branches = [functools.partial(_drafted_call, loop, n, propose_kwargs, target_params, keys_B,
                                  max_new_B) for n in policy.buckets]
    carry = _Branch(decode, state.drafter_state, k_B, None, None, None, None)
    out = _select(index, branches, _placeholders(branches[-1], carry))
  else:
    proposal = drafter.propose(gamma=gamma, **propose_kwargs)
    decode = _after_drafting(drafter, decode, proposal)
    evidence_B = jnp.clip(proposal.num_drafts_B, 0, gamma).astype(jnp.int32)
    index, k_B = draft_length.choose(policy, costs['total_N'], state.history, evidence_B,
                                     live_B, remaining_B)
    branches = [functools.partial(_verify_branch, loop, n, target_params, keys_B, max_new_B,
                                  proposal) for n in policy.buckets]
    carry = _Branch(decode, proposal.state, k_B, None, None, None, None)
    out = _select(index, branches, _placeholders(branches[-1], carry))
  new, view, proposed_state = out.decode, out.view, out.drafter_state
  drafted_B, accepted_B, num_accepted_B, k_B = (out.drafted_B, out.accepted_B,
                                                 out.num_accepted_B, out.k_B)
  drafter_state = drafter.update(params=drafter_params, state=proposed_state, target=view,
                                 **target_kwargs(drafter, target_params))

  live_i = live_B.astype(jnp.int32)
  c = state.counters
  counters = Counters(
      target_calls_B=c.target_calls_B + live_i,
      plain_calls_B=c.plain_calls_B + live_i * (k_B == 0),
      drafted_B=c.drafted_B + live_i * drafted_B,
      accepted_B=c.accepted_B + live_i * accepted_B,
      accepted_at_BxG=c.accepted_at_BxG + live_i[:, None] * (
          jnp.arange(gamma)[None, :] < accepted_B[:, None]),
      width_calls_N=c.width_calls_N.at[index].add(1))
  # A finished row's calls are no evidence (they may verify drafts it never commits).
  history = state.history.record(policy, jnp.where(live_B, k_B, 0),
                                 jnp.where(live_B, num_accepted_B, 0))
  return SpecState(new, drafter_state, history, counters)


def program(loop: program_lib.Loop, target_params, drafter_params, costs, tokens_BxS,
            lengths_B, max_new_B, keys_B, active_B):
  target, drafter, gamma = loop.target, loop.drafter, loop.gamma
  decode, out = prefill_lib.start(target, target_params, tokens_BxS, lengths_B, max_new_B, keys_B,
                                  active_B, prefill_len=loop.prefill_len, sampling=loop.sampling,
                                  eos_ids=loop.eos_ids, hidden_layers=drafter.hidden_layers)
  batch, prefill_len = tokens_BxS.shape[0], loop.prefill_len
  view = TargetView(tokens_BxS=decode.tokens_BxS, lengths_B=decode.lengths_B,
                    positions_BxT=jnp.broadcast_to(jnp.arange(prefill_len), (batch, prefill_len)),
                    hidden_BxTxD=out.hidden_BxTxD, layer_hidden_LxBxTxD=out.layer_hidden_LxBxTxD,
                    num_accepted_B=jnp.zeros((batch,), jnp.int32),
                    num_verified_B=jnp.zeros((batch,), jnp.int32))
  drafter_state = drafter.init(params=drafter_params, target=view,
                               **target_kwargs(drafter, target_params))
  counters = Counters.zeros(batch, gamma, _num_branches(loop)).replace(
      target_calls_B=active_B.astype(jnp.int32))   # the prefill call
  state = SpecState(decode, drafter_state, draft_length.History.init(batch), counters)

  running = prefill_lib.still_running(max_new_B)

  def cond(s: SpecState):
    return running(s.decode)

  body = functools.partial(_step, loop, target_params, drafter_params, costs, keys_B, max_new_B)
  state = jax.lax.while_loop(cond, body, state)
  c = state.counters
  return dict(tokens_BxS=state.decode.tokens_BxS, num_new_B=state.decode.num_new_B,
              steps=state.decode.step, target_calls_B=c.target_calls_B,
              plain_calls_B=c.plain_calls_B, drafted_B=c.drafted_B, accepted_B=c.accepted_B,
              accepted_at_BxG=c.accepted_at_BxG, width_calls_N=c.width_calls_N)


def _num_branches(loop: program_lib.Loop) -> int:
  return 2 if loop.tree is not None else len(loop.policy.buckets)


def check_gamma(gamma) -> int:
  if isinstance(gamma, bool) or not isinstance(gamma, numbers.Integral) or gamma < 1:
    raise ValueError(f'gamma must be an integer >= 1, got {gamma!r}')
  return int(gamma)


def make_policy(gamma: int, batch: int, *, adaptive: bool = True,
                buckets: Sequence[int] = (), costs: Sequence[float] = (),
                draft_costs: Sequence[float] = (),
                finish_softness: float = draft_length.Policy.finish_softness,
                outcome_samples: int = draft_length.Policy.outcome_samples,
                pool_rows: bool = draft_length.Policy.pool_rows) -> draft_length.Policy:
  """The draft-length policy for `gamma`: fixed, or adaptive over `buckets`
  (default: 0, the even counts below gamma, gamma) with measured `costs` (default: the
  roofline stand-in)."""
  if not adaptive:
    return draft_length.fixed(gamma)
  buckets = tuple(sorted(set(buckets))) or draft_length.default_buckets(gamma)
  if buckets[0] != 0 or buckets[-1] != gamma:
    raise ValueError(f'adaptive draft-length buckets must run from 0 (a plain step) to '
                     f'gamma={gamma}, got {buckets}')
  costs = tuple(costs) or draft_length.roofline_costs(buckets, batch)
  return draft_length.Policy(buckets=buckets, costs=costs, draft_costs=tuple(draft_costs),
                             adaptive=True,
                             finish_softness=finish_softness, outcome_samples=outcome_samples,
                             pool_rows=pool_rows)


def generate(target: LanguageModel, target_params, drafter: Drafter,
             prompts: Sequence[Sequence[int]] | batch_lib.PromptBatch, *, gamma: int,
             max_new_tokens: int,
             sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
             eos_ids: Sequence[int] = (), seed: int = 0, row_ids: Sequence[int] | None = None,
             max_cache_len: int | None = None,
             policy: draft_length.Policy | None = None,
             tree: Tree | None = None, warm_up: bool = False) -> SpeculativeGeneration:
  """Speculative generation for a batch of token-id prompts of any lengths.

  The output is distributed exactly as `autoregressive.generate`'s (identical
  for greedy decoding); rows use the same rng streams (`row_ids`) as there for
  the first token, and their own streams for drafting and acceptance.
  `policy` None is the adaptive default (`make_policy`). With a `tree`
  (`decoding/tree.py`) every step verifies that static token tree
  (`tree_verify.py`): gamma must be the tree's depth, and `policy` is unused.
  `warm_up` compiles and runs the program generating one token per row
  (`program.run`).
  """
  gamma = check_gamma(gamma)
  check_drafter(drafter, target)
  if tree is not None:
    if not isinstance(tree, Tree):
      raise TypeError(f'tree must be a decoding.tree.Tree, got {tree!r}')
    tree_verify.check_drafter(drafter, tree)
    if gamma != tree.max_depth:
      raise ValueError(f'gamma={gamma} but the tree {tree} is {tree.max_depth} deep: with a tree, '
                       'gamma is its depth')
  extra_slots = gamma + 1 if tree is None else tree.num_nodes + 1
  packed = program_lib.pack(target, prompts, max_new_tokens=max_new_tokens,
                            extra_slots=extra_slots, row_ids=row_ids, max_cache_len=max_cache_len)
  if tree is not None:
    policy = draft_length.fixed(gamma)  # unused: a tree call verifies the whole tree
  if policy is None:
    policy = make_policy(gamma, packed.tokens_BxS.shape[0])
  if policy.gamma != gamma:
    raise ValueError(f'the draft-length policy drafts up to {policy.gamma}, but gamma={gamma}')
  loop = program_lib.Loop(target=target, sampling=sampling, eos_ids=tuple(int(e) for e in eos_ids),
                          prefill_len=packed.prefill_len, drafter=drafter, gamma=gamma,
                          policy=policy, tree=tree)
  out, wall_s = program_lib.run(program, loop, target_params, drafter.params, packed,
                                max_new_tokens=max_new_tokens, seed=seed,
                                data=draft_length.cost_data(policy), warm_up=warm_up)
  active = packed.active_B
  return SpeculativeGeneration(
      new_tokens=batch_lib.new_tokens(out['tokens_BxS'], packed.lengths_B, out['num_new_B'],
                                      active),
      prompt_lengths=packed.prompt_lengths, wall_s=wall_s, steps=int(out['steps']), gamma=gamma,
      target_calls=[int(c) for c in out['target_calls_B'][active]],
      plain_calls=[int(c) for c in out['plain_calls_B'][active]],
      drafted_tokens=[int(d) for d in out['drafted_B'][active]],
      accepted_tokens=[int(a) for a in out['accepted_B'][active]],
      accepted_at_position=[row.tolist() for row in out['accepted_at_BxG'][active]],
      width_calls=[int(n) for n in out['width_calls_N']])
