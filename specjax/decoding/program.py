"""What both decoding programs share: their static settings, packing and the host wrapper.

A `Loop` is every static, hashable setting of one compiled program (as
gemma's `SamplerLoop`): jit sees it as one static argument, so the programs
take only arrays besides it. `pack` lays prompts out once (the experiment
reads the shape bucket from the same `PromptBatch` it then runs), and `run`
is the one host wrapper: it puts the batch on the device, runs the program,
waits for it, and times it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from specjax import sampling as sampling_lib
from specjax.decoding import batch as batch_lib


@dataclasses.dataclass(frozen=True)
class Loop:
  """The static settings of one decoding program.

  target: the LanguageModel (hashed by identity).
  drafter, gamma, policy: the speculative loop's drafter, the most tokens it
    drafts per target call, and its `draft_length.Policy`; None / 0 for the
    autoregressive program.
  tree: the speculative loop's static token tree (`decoding/tree.py`), or None
    for chains of drafts; with a tree, gamma is its depth.

  The token budget is not here: each row's is data (`max_new_B`), so one
  compiled program serves every `max_new_tokens` of its shape bucket (a sweep
  over lengths, a test's several budgets, the one-token warm-up).
  """

  target: Any
  sampling: sampling_lib.SamplingConfig
  eos_ids: tuple[int, ...]
  prefill_len: int
  drafter: Any = None
  gamma: int = 0
  policy: Any = None
  tree: Any = None


def pack(model, prompts: Sequence[Sequence[int]] | batch_lib.PromptBatch, *,
         max_new_tokens: int, extra_slots: int, row_ids: Sequence[int] | None = None,
         max_cache_len: int | None = None, run_longest: int = 0,
         min_prefill: int = 16) -> batch_lib.PromptBatch:
  """Prompts laid out for `model` (a PromptBatch is passed through as packed);
  `run_longest` and `min_prefill` as `batch.pack`'s."""
  if isinstance(prompts, batch_lib.PromptBatch):
    return prompts
  max_slots = min(max_cache_len or model.config.max_position, model.config.max_position)
  return batch_lib.pack(prompts, max_new_tokens=max_new_tokens, extra_slots=extra_slots,
                        max_slots=max_slots, row_ids=row_ids,
                        rows_multiple=model.data_parallelism,
                        vocab_size=model.config.vocab_size, run_longest=run_longest,
                        min_prefill=min_prefill)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _compiled(program: Callable, loop: Loop, *args):
  return program(loop, *args)


def run(program: Callable, loop: Loop, target_params, drafter_params,
        packed: batch_lib.PromptBatch, *, max_new_tokens: int, seed: int, data=None,
        warm_up: bool = False) -> tuple[dict[str, np.ndarray], float]:
  """Runs `program(loop, target_params, drafter_params, data, tokens_BxS,
  lengths_B, max_new_B, keys_B, active_B)` to completion; returns its outputs
  on the host and the wall time. `data` is any other pytree of arrays the
  program reads (measured costs: data, so they never recompile it).

  `warm_up` runs the same compiled program with a budget of one new token per
  row (the budget is data): it compiles the program and pays its first call's
  costs without generating, so an experiment's untimed first run is cheap.
  """
  keys_B = sampling_lib.row_keys(seed, packed.row_ids_B)
  max_new_B = np.full(packed.lengths_B.shape, 1 if warm_up else max_new_tokens, np.int32)
  start = time.perf_counter()
  out = _compiled(program, loop, target_params, drafter_params, data, packed.tokens_BxS,
                  packed.lengths_B, max_new_B, keys_B, packed.active_B)
  out = jax.device_get(out)
  return out, time.perf_counter() - start
