"""Prompt lookup decoding (Saxena 2023): draft by copying from the context.

Match each row's last n committed tokens (n from `max_n` down to `min_n`)
against every earlier window of its context; at the most recent match, propose
the gamma tokens that followed it. The matched copy is periodic: if the
continuation runs into the suffix itself, it repeats with the period of the
match, which is what the target does in a loop. A row with no match at any n
has no evidence (`num_drafts_B` = 0): the adaptive loop then takes a plain
decode step for it, as transformers' prompt lookup does; its drafts (the last
token repeated) are verified only with a fixed draft length. Fixed shapes
throughout: a [B, S] comparison per n, no host work. The proposal is
deterministic, so q is one-hot (returned as None).

For a token tree (`propose_tree`) the drafter ranks several continuations
(different suffix lengths, different earlier occurrences) and lays them into
the tree as a trie (`candidate_tree.py`): siblings are distinct tokens.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.drafters import base
from specjax.drafters import candidate_tree

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Settings:
  """max_n, min_n: the longest and shortest suffix looked up in the context.
  matches: for a token tree, the latest occurrences of each suffix length whose
  continuations fill the tree's branches (`candidates`)."""

  max_n: int = 3
  min_n: int = 1
  matches: int = 4

  def __post_init__(self):
    if not 1 <= self.min_n <= self.max_n:
      raise ValueError(f'min_n / max_n need 1 <= min_n <= max_n, got {self.min_n}, {self.max_n}')
    if self.matches < 1:
      raise ValueError(f'matches must be >= 1, got {self.matches}')


def match_starts(tokens_BxS: Array, lengths_B: Array, n: int) -> Array:
  """Every start j < L - n whose n tokens equal the row's last n tokens, as a [B, S] mask."""
  batch, num_slots = tokens_BxS.shape
  rows = jnp.arange(batch)
  starts_S = jnp.arange(num_slots)
  match_BxS = jnp.ones((batch, num_slots), bool)
  for k in range(n):
    suffix_token_B = tokens_BxS[rows, jnp.clip(lengths_B - n + k, 0, num_slots - 1)]
    shifted_BxS = jnp.roll(tokens_BxS, -k, axis=1)  # shifted[:, j] = tokens[:, j + k]
    match_BxS &= shifted_BxS == suffix_token_B[:, None]
  match_BxS &= starts_S[None, :] + n < lengths_B[:, None]  # a continuation exists
  match_BxS &= (lengths_B >= n + 1)[:, None]
  return match_BxS


def find_match(tokens_BxS: Array, lengths_B: Array, n: int) -> tuple[Array, Array]:
  """The latest start j < L - n whose n tokens equal the row's last n tokens."""
  starts_S = jnp.arange(tokens_BxS.shape[1])
  match_BxS = match_starts(tokens_BxS, lengths_B, n)
  start_B = jnp.max(jnp.where(match_BxS, starts_S[None, :], -1), axis=1)
  return start_B >= 0, jnp.maximum(start_B, 0)


def continuation(tokens_BxS: Array, lengths_B: Array, follow_B: Array, length: int) -> Array:
  """The `length` tokens from `follow`, repeating with the match's period past the end."""
  period_B = jnp.maximum(lengths_B - follow_B, 1)
  idx_BxG = follow_B[:, None] + jnp.arange(length)[None, :] % period_B[:, None]
  return jnp.take_along_axis(tokens_BxS, jnp.clip(idx_BxG, 0, tokens_BxS.shape[1] - 1), axis=1)


def propose_ngram(tokens_BxS: Array, lengths_B: Array, gamma: int, max_n: int,
                  min_n: int) -> tuple[Array, Array]:
  """The drafts, and the length of the suffix that matched (0: none)."""
  batch, num_slots = tokens_BxS.shape
  rows = jnp.arange(batch)
  last_B = tokens_BxS[rows, jnp.maximum(lengths_B - 1, 0)]
  draft_BxG = jnp.broadcast_to(last_B[:, None], (batch, gamma))
  matched_B = jnp.zeros((batch,), jnp.int32)
  for n in range(max_n, min_n - 1, -1):
    found_B, start_B = find_match(tokens_BxS, lengths_B, n)
    use_B = found_B & (matched_B == 0)
    copied_BxG = continuation(tokens_BxS, lengths_B, start_B + n, gamma)
    draft_BxG = jnp.where(use_B[:, None], copied_BxG, draft_BxG)
    matched_B = jnp.where(use_B, n, matched_B)
  return draft_BxG.astype(jnp.int32), matched_B


def candidates(tokens_BxS: Array, lengths_B: Array, depth: int, max_n: int, min_n: int,
               matches: int) -> tuple[Array, Array]:
  """Ranked continuations for a token tree: the `matches` latest occurrences of the
  last n tokens for n from max_n down to min_n (longer suffixes first, then the
  more recent), each followed for `depth` tokens as `propose_ngram` follows its
  one match; its first found candidate is `propose_ngram`'s drafts. Returns
  candidates_BxMxD and found_BxM."""
  starts_S = jnp.arange(tokens_BxS.shape[1])
  conts, found = [], []
  for n in range(max_n, min_n - 1, -1):
    match_BxS = match_starts(tokens_BxS, lengths_B, n)
    for _ in range(matches):
      start_B = jnp.max(jnp.where(match_BxS, starts_S[None, :], -1), axis=1)
      match_BxS &= starts_S[None, :] < start_B[:, None]   # the next one is earlier
      conts.append(continuation(tokens_BxS, lengths_B, jnp.maximum(start_B, 0) + n, depth))
      found.append(start_B >= 0)
  return jnp.stack(conts, axis=1).astype(jnp.int32), jnp.stack(found, axis=1)


def make(settings: Settings = Settings()) -> base.Drafter:

  def propose(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, gamma, shared=None):
    del params, keys_B, sampling, shared
    draft_BxG, matched_B = propose_ngram(tokens_BxS, lengths_B, gamma, settings.max_n,
                                         settings.min_n)
    return base.Proposal(draft_BxG, None, jnp.where(matched_B > 0, gamma, 0), state)

  def propose_tree(*, params, state, tokens_BxS, lengths_B, keys_B, sampling, tree,
                   shared=None):
    del params, keys_B, sampling, shared
    candidates_BxMxD, found_BxM = candidates(tokens_BxS, lengths_B, tree.max_depth,
                                             settings.max_n, settings.min_n, settings.matches)
    tokens_BxN, valid_BxN = candidate_tree.fill(tree, candidates_BxMxD, found_BxM)
    return base.TreeProposal(tokens_BxN, None, valid_BxN, state)

  return base.Drafter(name='ngram', vocab_size=None, init=base.no_state_init,
                      update=base.no_state_update, propose=propose, propose_tree=propose_tree)
