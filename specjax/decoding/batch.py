"""Packing prompts of different lengths into the fixed shapes one program needs.

Each row keeps its own length and positions (no left padding, no lockstep):
prompt tokens sit at slots [0, length) of a `[B, S]` token buffer whose slots
match the KV cache's. Shapes are bucketed so that a sweep over many prompts
compiles a few programs, not one per prompt: the prefill length to a power of
two (at least 16, or `min_prefill`: an experiment asks for PREFILL_MIN), and
the slots to a multiple of 128, enough for the longest prompt of the whole run
when the caller names it (an experiment does), so every batch of a run has one
slot count. Rows added to fill a mesh's 'data'
axis are marked inactive and never touch results or statistics.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class PromptBatch:
  tokens_BxS: np.ndarray      # int32; prompt at [0, length), zeros after
  lengths_B: np.ndarray       # int32 prompt lengths (1 for inactive rows)
  row_ids_B: np.ndarray       # uint32 rng stream id per row
  active_B: np.ndarray        # bool; False for padding rows
  prefill_len: int            # static prefill width (>= every prompt length)

  @property
  def num_slots(self) -> int:
    return self.tokens_BxS.shape[1]

  @property
  def num_rows(self) -> int:
    return int(self.active_B.sum())

  @property
  def prompt_lengths(self) -> list[int]:
    return [int(n) for n in self.lengths_B[self.active_B]]

  @property
  def bucket(self) -> tuple[tuple[int, int], int]:
    """The shapes that select a compiled program."""
    return self.tokens_BxS.shape, self.prefill_len


# The shortest prefill of an experiment's batches. Every shorter prompt shares its
# program: on the 270M on a 2-core CPU a prefill over 128 positions took 128 ms,
# over 32 positions 56 ms (a jitted forward at batch 1), a few hundredths of a
# 64-token generation, where a compile of the speculative program takes 10-30 s.
# Not the library's default: a statistical test's 2**17 rows would hold 8x the
# prompt-position hidden states a drafter's init reads.
PREFILL_MIN = 128


def _next_power_of_two(n: int, minimum: int = 16) -> int:
  return max(minimum, 1 << (n - 1).bit_length())


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def pack(prompts: Sequence[Sequence[int]], *, max_new_tokens: int, extra_slots: int = 0,
         max_slots: int, row_ids: Sequence[int] | None = None, rows_multiple: int = 1,
         vocab_size: int | None = None, run_longest: int = 0,
         min_prefill: int = 16) -> PromptBatch:
  """Validates prompts and lays them out; `extra_slots` is how far past the last
  committed token a step may write (gamma + 1 for a verify step, 1 for a
  decode step, whose single entry kv_cache.write writes twice). `run_longest`,
  the longest prompt of the run this batch is part of, sizes the cache for it
  too (capped at max_slots), so the run's batches share one slot count;
  `min_prefill` is the shortest prefill width."""
  if not prompts:
    raise ValueError('no prompts given')
  if max_new_tokens < 1:
    raise ValueError(f'max_new_tokens must be >= 1, got {max_new_tokens}')
  lengths = [len(p) for p in prompts]
  for i, (prompt, n) in enumerate(zip(prompts, lengths)):
    if n == 0:
      raise ValueError(f'prompt {i} is empty: every prompt needs at least one token (BOS)')
    needed = n + max_new_tokens + extra_slots
    if needed > max_slots:
      raise ValueError(
          f'prompt {i} has {n} tokens; with max_new_tokens={max_new_tokens} and '
          f'{extra_slots} verify slots it needs {needed} cache slots, more than the '
          f'{max_slots} allowed (max_cache_len / the model\'s context)')
    if vocab_size is not None and (min(prompt) < 0 or max(prompt) >= vocab_size):
      raise ValueError(f'prompt {i} has token ids outside [0, {vocab_size})')
  prefill_len = min(_next_power_of_two(max(lengths), min_prefill), max_slots)
  longest = max(max(lengths), run_longest)
  num_slots = min(max_slots, _round_up(max(prefill_len, longest + max_new_tokens
                                           + extra_slots), 128))
  num_slots = max(num_slots, prefill_len)
  real = len(prompts)
  batch = _round_up(real, rows_multiple)
  tokens = np.zeros((batch, num_slots), np.int32)
  for i, prompt in enumerate(prompts):
    tokens[i, :len(prompt)] = prompt
  lengths_b = np.ones((batch,), np.int32)
  lengths_b[:real] = lengths
  ids = np.arange(batch, dtype=np.uint32) if row_ids is None else np.asarray(
      list(row_ids) + [0] * (batch - real), np.uint32)
  active = np.arange(batch) < real
  return PromptBatch(tokens, lengths_b, ids, active, prefill_len)


def new_tokens(tokens_BxS: np.ndarray, prompt_lengths_B: np.ndarray,
               num_new_B: np.ndarray, active_B: np.ndarray) -> list[list[int]]:
  """The generated ids of every active row (EOS included when one ended it)."""
  return [tokens_BxS[b, prompt_lengths_B[b]:prompt_lengths_B[b] + num_new_B[b]].tolist()
          for b in range(len(active_B)) if active_B[b]]
