"""What a drafter is: three pure, keyword-only functions over an explicit state pytree.

  init(*, params, target: TargetView) -> state
      Runs after the target's prefill; `target` holds the prompts and the
      target's hidden states at every prompt position.
  update(*, params, state, target: TargetView) -> state
      Runs after every target call (a verify call or a plain decode step):
      `target` holds the committed context (the corrected or bonus token
      included), the hidden states the call computed at its positions, and
      how many drafts each row had verified and accepted.
  propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma,
          shared=None) -> Proposal
      Proposes gamma tokens after each row's last committed token, q (what
      each was drawn from; None for a deterministic drafter, whose q is one-hot)
      and how many of them the row has evidence for. `shared` is the target's
      (params, cache) for a drafter that declares `shares_target_cache`; it
      returns the cache it wrote in `Proposal.shared_cache`.

  propose_tree(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, tree,
               shared=None) -> TreeProposal            (optional)
      Fills a static token tree (`decoding/tree.py`): a token per node, q,
      and which nodes the row has evidence for. Siblings must be distinct
      deterministic tokens (q None) or i.i.d. draws from the q reported for
      them (the rule in `decoding/tree_acceptance.py`). A drafter without it
      verifies chain-shaped trees only, through `propose`.

A drafter that declares `reads_target_params` (EAGLE embeds tokens with the
target's table) gets the target's params as `target_params=` in all three.

A drafter that declares `costly_drafts` runs a network for each draft (a draft
model, the target's early layers, an EAGLE layer, Medusa heads). Under the
adaptive draft length the loop then chooses the call's width before drafting,
from each row's acceptance history and the measured cost of drafting and
verifying each width, and proposes only that many drafts: a plain step drafts
nothing. A free drafter (n-gram lookup) drafts first and reports its evidence,
and the width is chosen from that (`decoding/draft_length.py`).

  plan(*, params, state, tokens_BxS, lengths_B) -> Plan      (optional)
      For a drafter with costly drafts whose rows draft from sources of
      different cost and acceptance (a hybrid: n-gram lookup where the
      context has a match, free; its network elsewhere): before the width
      is chosen, each row's acceptance rate for the source that will draft
      it and which rows will run the network. The loop weighs a step in
      which no live row runs it at the cost of verifying alone.

All functions run inside the one compiled decoding loop, so shapes are fixed
and every count is data. Hidden states a drafter reads come from the
target's forward pass (`hidden_layers` names the layers it wants beside the
final-norm output), so no drafter recomputes the target. No registry:
`specjax.drafters.make_drafter` is a plain function that builds one by name.

Shape letters: B batch, S token/cache slots, T positions of a target call,
D width, L requested hidden layers, G gamma, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import jax

Array = jax.Array


@flax.struct.dataclass
class TargetView:
  """What a drafter sees of the target after a call.

  tokens_BxS, lengths_B: committed tokens; the last of each row is pending.
  positions_BxT: the positions the call ran at (prompt positions for init;
    the pending token and the drafts for update, L_old - 1 ...).
  hidden_BxTxD: final-norm hidden states at those positions (zero past what
    the call ran, e.g. after a plain decode step, which runs one position).
  layer_hidden_LxBxTxD: the residual stream after each of the drafter's
    `hidden_layers`, or None.
  num_accepted_B: drafts each row accepted (0 after prefill or a plain step).
  num_verified_B: drafts each row verified, accepted or not (0 after prefill or
    a plain step; for a token tree, its deepest valid path): with the accepted
    count, what a drafter needs to keep its own acceptance history.
  """

  tokens_BxS: Array
  lengths_B: Array
  positions_BxT: Array
  hidden_BxTxD: Array
  layer_hidden_LxBxTxD: Array | None
  num_accepted_B: Array
  num_verified_B: Array


@flax.struct.dataclass
class Proposal:
  """gamma drafts per row, q, and how many of them each row asks to verify.

  num_drafts_B in [0, gamma] is the row's evidence (an n-gram match, a
  confident draft): the loop verifies at most that many, and a step where
  no row has any costs one plain decode step.
  """

  draft_BxG: Array
  q_BxGxV: Array | None
  num_drafts_B: Array
  state: Any
  shared_cache: Any = None


@flax.struct.dataclass
class TreeProposal:
  """A token per tree node (N nodes, parents before children), q, and evidence.

  valid_BxN: the nodes the row asks to verify; an invalid node is never
    accepted. A valid node's parent must be valid (or the root).
  """

  tokens_BxN: Array
  q_BxNxV: Array | None
  valid_BxN: Array
  state: Any
  shared_cache: Any = None


@flax.struct.dataclass
class Plan:
  """What a drafter with costly drafts says before the loop chooses the width.

  acceptance_B: each row's estimated acceptance rate per draft, for the source
    that will draft it (what `draft_length.History.acceptance` gives).
  costly_B: the rows whose drafts will run the network.
  """

  acceptance_B: Array
  costly_B: Array


@dataclasses.dataclass(frozen=True, eq=False)
class Drafter:
  name: str
  vocab_size: int | None      # None: proposes ids from the context (n-gram)
  init: Callable[..., Any]
  update: Callable[..., Any]
  propose: Callable[..., Proposal]
  params: Any = None          # the drafter's own weights (None for n-gram / early exit)
  hidden_layers: tuple[int, ...] = ()  # target layers whose hidden states it reads
  shares_target_cache: bool = False
  reads_target_params: bool = False   # init / update / propose get target_params=
  propose_tree: Callable[..., TreeProposal] | None = None  # None: chain-shaped trees only
  costly_drafts: bool = False   # each draft runs a network: choose the width before drafting
  plan: Callable[..., Plan] | None = None   # costly drafts from sources of different cost


def no_state_init(*, params, target: TargetView):
  del params, target
  return ()


def no_state_update(*, params, state, target: TargetView):
  del params, target
  return state


def settings_from(cls, values: Any, key: str):
  """A drafter's frozen settings dataclass from its nested config entry.

  Unknown keys, wrong types and (through the dataclass's own checks) values out
  of range raise a ValueError naming `config.<key>.<field>`.
  """
  values = dict(values.to_dict() if hasattr(values, 'to_dict') else values or {})
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - set(fields))
  if unknown:
    raise ValueError(f'config.{key} has unknown setting(s) {", ".join(unknown)}; '
                     f'known: {", ".join(fields) or "none"}')
  for name, value in values.items():
    kind = {'int': int, 'float': (int, float), 'str': str, 'bool': bool,
            'tuple': (tuple, list)}[fields[name].type]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
      raise ValueError(f'config.{key}.{name} must be a {fields[name].type}, got {value!r}')
    if kind == (tuple, list):
      values[name] = tuple(value)
  try:
    return cls(**values)
  except ValueError as e:
    raise ValueError(f'config.{key}.{e}') from None
