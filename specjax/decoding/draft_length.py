"""How many drafts each target call verifies: per row, from evidence, aware of the batch.

A verify call over n drafts costs more than a plain decode step (on a 2-core
CPU about 1.2x at n = 1 and 1.6x at n = 4; on an accelerator at a large batch
it becomes compute-bound), and it pays only if the drafts get accepted. So
each step:

  1. the drafter says how many of its gamma drafts each row has evidence for
     (`Proposal.num_drafts_B`: an n-gram match, a confident draft);
  2. each row's acceptance rate a_b is estimated from its own history (a
     decayed count of accepted and rejected drafts with a Beta prior);
  3. among the static buckets of draft counts (0 = a plain decode step, ...,
     gamma), the step takes the one that maximises expected committed tokens
     per unit of cost, counted by how they shorten the batch's finishing time
     (below); at batch 1 that is
        E(a, min(k, n)) / cost(n),   E(a, k) = (1 - a^(k+1)) / (1 - a)
     (Leviathan et al. 2023), with cost(n) the measured cost of a call over
     n + 1 positions at this batch size relative to a decode step;
  4. every row verifies min(k_b, n) drafts; the call's shape is the bucket's.

How a batch finishes decides what a step is worth. Rows decoded together take
as long as the slowest of them, so a step is worth how much it shortens the
longest remaining work, not the sum of every row's progress. Summing made a
batch of 16 speculate whenever the average row had a match, while the rows
left behind (those without one) set the finishing time: it took 8% fewer
steps at 1.9x the cost per step. The finishing time is taken as a smooth
maximum of the rows' remaining tokens R_b,
    M(R) = tau * log sum_b exp(R_b / tau),
and a step over n drafts is worth M(R) - M(R - E_n) per cost(n), with E_n
each row's expected committed tokens (at most R_b). A plain step is worth
exactly 1, and at batch 1 the rule is the tokens-per-cost one above. Drafts
that only push the leading rows further ahead are worth little; drafts for
the rows left behind are worth what they take off the maximum, and only up to
where the next rows take over. `finish_softness` is tau, in tokens: it stands
for not knowing which row will end last (rows level with each other all
count); infinity gives back the mean over rows, tau -> 0 the slowest row
alone.

At batch > 1 the reduction is averaged over the call's outcomes, not taken at
each row's expected tokens: E[M(R) - M(R - X)] over `outcome_samples` joint
draws of every row's committed tokens X_b (1 + its accepted prefix, a
truncated geometric law at the row's acceptance rate). M is convex, so the
reduction at the expected tokens overvalues a call (Jensen): among sixteen
level rows some row almost surely rejects its first draft, and that row, not
the average one, is the maximum after the step. On a 2-core AVX-512 CPU
(benchmarks/speculative.py, 26 raw-text Spec-Bench prompts, 128 tokens, one
run; experiments/2026-12-batch-policy-gemma270m-cpu) n-gram drafting at batch
4 / 8 / 16 ran 1.09x / 1.10x / 0.98x of plain decoding valued at expected
tokens and 1.12x / 1.11x / 1.03x over outcomes; an earlier run at batch 16
valued at expected tokens gave 0.81x, and a later one, where batch-16 calls
measured dearer and both rules took plain steps there, 1.09x / 1.01x / 1.01x
against 1.04x / 1.04x / 0.99x: the measured difference is within what runs
move by, the argument for outcomes is Jensen's.

For a drafter whose drafts are costly (`Drafter.costly_drafts`: a network per
draft) the order changes: its evidence is taken to be gamma, the bucket is
chosen from history alone before it drafts, cost(n) includes drafting n
tokens, and it proposes only n drafts (a plain step drafts nothing); its own
evidence (a confident prefix) then caps each row within the bucket. Drafting
first and choosing after would pay for drafts that a plain step throws away:
a draft step of the target's own layers costs 0.6 of a decode step on a 2-core
CPU.

A drafter whose rows draft from sources of different cost and acceptance (a
hybrid of n-gram lookup and a network, `Drafter.plan`) says before the choice
which rows will run the network and each row's acceptance rate for its own
source; a step in which no live row runs the network costs `costs` minus
`draft_costs`, the drafting part of each bucket's measured cost. One history
and one cost table for both sources weighed alike a copy, free to draft, and
an EAGLE draft, of which 4 cost 0.24-0.31 of a decode step on a 2-core Xeon
(`benchmarks/drafter_speed.py`, 7 December 2026) and which is accepted less
often (greedy on raw-text Spec-Bench, 0.37 of EAGLE's drafts against 0.55 of
lookup's). In that benchmark the plan changed the hybrid's speed by less than
runs move (13 tasks: 0.716 of plain decoding's time against 0.724 without it):
its worth is that the costs the policy weighs are the ones each step pays.

Each bucket is one branch of the compiled program (a while loop of zero or
one iterations, `speculative._select`), so the loop never leaves the device.
With `adaptive=False` every step verifies all gamma drafts of every row (the
classic fixed-gamma loop). The choice depends only on committed tokens and past acceptances,
never on the target's output for this step, so sampling stays exact.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Policy:
  """buckets: draft counts a call may verify, ascending (0 is a plain step).
  costs: each bucket's relative cost (a plain decode step is 1.0). They are
    measured, so they reach the compiled program as data (`cost_data`),
    never as constants: a policy is a static argument, and costs that differ
    by a microsecond must not compile a program again.
  draft_costs: the part of each bucket's cost that is drafting (a drafter
    with costly drafts; `step_costs.measure_parts`), or () for none known: a
    step in which no row runs the network (`Drafter.plan`) costs the rest.
  adaptive: False verifies every row's gamma drafts at every step.
  prior, prior_weight: the Beta prior of a row's acceptance rate, in drafts.
  decay: how fast old acceptances are forgotten (per step).
  finish_softness: tau, in tokens, of the smooth maximum over rows' remaining
    tokens whose reduction a step is worth (see the module's doc).
  outcome_samples: at batch > 1, the outcomes of a call over which that
    reduction is averaged (`committed_samples`); 0 takes it at each row's
    expected tokens instead, which overvalues a call (the smooth maximum is
    convex, and the row that rejects early is the one that lags).
  pool_rows: at batch > 1, the mean of a row's prior is the other rows'
    pooled rate (`History.acceptance`), not `prior` alone. Off by default: at
    batch 4 and 8 on a 2-core CPU (26 raw-text Spec-Bench prompts, 64 tokens,
    one run) it ran 1.01x / 0.98x of plain decoding against 1.04x / 1.02x
    without, with nearly the same choice of widths: no gain beyond what runs
    move by."""

  buckets: tuple[int, ...]
  costs: tuple[float, ...] = dataclasses.field(compare=False)
  adaptive: bool = True
  prior: float = 0.5
  prior_weight: float = 2.0
  decay: float = 0.9
  finish_softness: float = 4.0
  outcome_samples: int = 64
  pool_rows: bool = False
  draft_costs: tuple[float, ...] = dataclasses.field(default=(), compare=False)

  def __post_init__(self):
    if len(self.buckets) != len(self.costs) or not self.buckets:
      raise ValueError(f'buckets {self.buckets} and costs {self.costs} must be non-empty and '
                       'of the same length')
    if list(self.buckets) != sorted(set(self.buckets)) or self.buckets[0] < 0:
      raise ValueError(f'buckets must be distinct counts >= 0 in ascending order, '
                       f'got {self.buckets}')
    if any(not c > 0 for c in self.costs):
      raise ValueError(f'costs must be > 0, got {self.costs}')
    if self.draft_costs and (
        len(self.draft_costs) != len(self.costs)
        or any(not 0 <= d < c for d, c in zip(self.draft_costs, self.costs))):
      raise ValueError(f'draft_costs {self.draft_costs} must be empty or, for each bucket, '
                       f'at least 0 and below its cost (costs {self.costs})')
    if not 0.0 < self.prior < 1.0 or self.prior_weight <= 0 or not 0.0 < self.decay <= 1.0:
      raise ValueError('need 0 < prior < 1, prior_weight > 0 and 0 < decay <= 1')
    if not self.finish_softness > 0:
      raise ValueError(f'finish_softness must be > 0 tokens, got {self.finish_softness}')
    if self.outcome_samples < 0:
      raise ValueError(f'outcome_samples must be >= 0, got {self.outcome_samples}')
    if not self.adaptive and len(self.buckets) != 1:
      raise ValueError('a fixed draft length has exactly one bucket')

  @property
  def gamma(self) -> int:
    return self.buckets[-1]


def default_buckets(gamma: int) -> tuple[int, ...]:
  """A plain step, every even draft count below gamma, and gamma (gamma <= 2: every count).

  Short calls are the ones a batch can afford: at batch 4 on a 2-core CPU only
  calls over 3 positions paid (a call there is compute-bound), while at batch 1
  calls of 6 drafts paid on text that copies well. Steps of 2 keep both within
  reach: gamma 4 -> (0, 2, 4), gamma 6 -> (0, 2, 4, 6), gamma 3 -> (0, 2, 3),
  gamma 2 -> (0, 1, 2) (experiments/2026-12-default-gamma-gemma270m-cpu).
  """
  if gamma <= 2:
    return tuple(range(gamma + 1))
  return tuple(sorted({0, *range(2, gamma, 2), gamma}))


def roofline_costs(buckets: Sequence[int], batch: int) -> tuple[float, ...]:
  """A stand-in when no measured costs are given: each extra verified position
  costs 15% of a decode step per row (what a 2-core CPU shows at batch 1).
  `step_costs.measure` gives the real figures for a device and batch size."""
  return tuple(1.0 + 0.15 * n * batch for n in buckets)


def fixed(gamma: int) -> Policy:
  return Policy(buckets=(gamma,), costs=(1.0,), adaptive=False)


@flax.struct.dataclass
class History:
  """Per row, decayed counts of accepted drafts and of rejections."""

  accepted_B: Array
  rejected_B: Array

  @classmethod
  def init(cls, batch: int) -> History:
    zeros = jnp.zeros((batch,), jnp.float32)
    return cls(zeros, zeros)

  def record(self, policy: Policy, num_drafts_B: Array, num_accepted_B: Array) -> History:
    """After a call. Old counts decay every step, tried or not, so a row that
    stopped drafting drifts back to the prior and tries again."""
    rejected_B = (num_accepted_B < num_drafts_B).astype(jnp.float32)
    return History(self.accepted_B * policy.decay + num_accepted_B.astype(jnp.float32),
                   self.rejected_B * policy.decay + rejected_B)

  def acceptance(self, policy: Policy) -> Array:
    """Each row's acceptance rate: its decayed counts under a Beta prior of
    `prior_weight` drafts. With `pool_rows` the prior's mean is what the other
    rows of the batch have shown (their pooled counts under `prior`): the
    rows draft from one drafter on one kind of text more often than not, and
    a row's first few outcomes say little, so a batch whose rows all reject
    stops drafting after one step instead of each row paying for its own
    failures; a row's own counts still outweigh it within a few calls. At
    batch 1 there are no other rows and the prior is `prior`."""
    weight = policy.prior_weight
    mean_B = jnp.full(self.accepted_B.shape, policy.prior, jnp.float32)
    if policy.pool_rows:
      others_accepted_B = jnp.sum(self.accepted_B) - self.accepted_B
      others_rejected_B = jnp.sum(self.rejected_B) - self.rejected_B
      mean_B = ((others_accepted_B + policy.prior * weight)
                / (others_accepted_B + others_rejected_B + weight))
    return (self.accepted_B + mean_B * weight) / (self.accepted_B + self.rejected_B + weight)


def expected_tokens(a_B: Array, k_B: Array) -> Array:
  """Committed tokens per call with k drafts at i.i.d. acceptance a (corrected or
  bonus token included): (1 - a^(k+1)) / (1 - a)."""
  a_B = jnp.clip(a_B, 0.0, 0.999)
  return (1.0 - a_B ** (k_B + 1).astype(jnp.float32)) / (1.0 - a_B)


def committed_samples(a_B: Array, k_NxB: Array, num_samples: int) -> Array:
  """[S, N, B] tokens each row commits in S equally likely outcomes of a call
  (k drafts at i.i.d. acceptance a: X = 1 + the accepted prefix, P(X > j) = a^j
  for j <= k). The uniforms are a fixed rank-1 lattice, stratified per row and
  shared by every bucket, so buckets are compared on the same outcomes and the
  choice is a deterministic function of history and evidence."""
  a_B = jnp.clip(a_B.astype(jnp.float32), 1e-6, 0.999)
  batch = a_B.shape[0]
  golden = (math.sqrt(5.0) - 1.0) / 2.0
  u_SxB = jnp.mod((jnp.arange(num_samples, dtype=jnp.float32)[:, None] + 0.5) / num_samples
                  + golden * jnp.arange(batch, dtype=jnp.float32)[None, :], 1.0)
  run_SxB = jnp.floor(jnp.log(u_SxB) / jnp.log(a_B)[None, :])   # accepted prefix, uncapped
  return 1.0 + jnp.minimum(run_SxB[:, None, :], k_NxB[None, :, :].astype(jnp.float32))


def finish_reduction(policy: Policy, remaining_B: Array, tokens_NxB: Array, live_B: Array
                     ) -> Array:
  """[N] M(R) - M(R - X_n) over live rows, M the smooth maximum of remaining
  tokens (see the module's doc), averaged over any leading axes of the tokens
  (outcomes: `tokens_NxB` may be [S, N, B]); the mean of X_n when tau is infinite."""
  outcome_axes = tuple(range(tokens_NxB.ndim - 2))
  row_shape = (1,) * (tokens_NxB.ndim - 1) + (-1,)
  remaining = remaining_B.astype(jnp.float32).reshape(row_shape)
  live = live_B.reshape(row_shape)
  tokens_NxB = jnp.minimum(tokens_NxB, remaining)
  tau = policy.finish_softness
  if math.isinf(tau):
    return jnp.mean(jnp.sum(jnp.where(live, tokens_NxB, 0.0), axis=-1), axis=outcome_axes
                    ) / jnp.maximum(jnp.sum(live_B), 1)

  def smooth_max(r_NxB):
    return tau * jax.nn.logsumexp(jnp.where(live, r_NxB / tau, -jnp.inf), axis=-1)

  reduction_N = jnp.mean(smooth_max(remaining) - smooth_max(remaining - tokens_NxB),
                         axis=outcome_axes)
  return jnp.where(jnp.any(live_B), reduction_N, 0.0)  # no live row: -inf - -inf


def cost_data(policy: Policy) -> dict[str, np.ndarray]:
  """The policy's costs as the compiled program's data: each bucket's cost
  (`total_N`) and the part of it that is drafting (`drafting_N`, zeros if unknown)."""
  total_N = np.asarray(policy.costs, np.float32)
  drafting_N = (np.asarray(policy.draft_costs, np.float32) if policy.draft_costs
                else np.zeros_like(total_N))
  return {'total_N': total_N, 'drafting_N': drafting_N}


def choose(policy: Policy, costs_N: Array, history: History, evidence_B: Array, live_B: Array,
           remaining_B: Array, acceptance_B: Array | None = None) -> tuple[Array, Array]:
  """The bucket index for this step and each row's draft count within it;
  `costs_N` is each bucket's cost as data, `remaining_B` each row's tokens still to
  generate, `acceptance_B` each row's acceptance rate (default: `history`'s)."""
  if not policy.adaptive:
    return jnp.int32(0), jnp.full(evidence_B.shape, policy.gamma, jnp.int32)
  a_B = history.acceptance(policy) if acceptance_B is None else acceptance_B
  buckets_N = jnp.asarray(policy.buckets, jnp.int32)
  k_NxB = jnp.minimum(evidence_B[None, :], buckets_N[:, None])
  # A row commits at most what it has left: drafts past R - 1 are worth nothing
  # (the expectation of min(X, R), not min(E[X], R), which overvalues them).
  useful_NxB = jnp.minimum(k_NxB, jnp.maximum(remaining_B - 1, 0)[None, :])
  if (evidence_B.shape[0] == 1 or math.isinf(policy.finish_softness)
      or not policy.outcome_samples):
    tokens = expected_tokens(a_B[None, :], useful_NxB)   # linear in them at batch 1, tau = inf
  else:
    tokens = committed_samples(a_B, useful_NxB, policy.outcome_samples)
  value_N = (finish_reduction(policy, remaining_B, tokens, live_B)
             / costs_N.astype(jnp.float32))
  index = jnp.argmax(value_N).astype(jnp.int32)
  return index, jnp.minimum(evidence_B, buckets_N[index]).astype(jnp.int32)
