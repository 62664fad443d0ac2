"""What a drafter is: three pure functions over an explicit state pytree.

  init(dparams, tokens_BxS, lengths_B, prefill_len, target_cache) -> state
      Reads the prompts (committed tokens at [0, lengths_B)).
  update(dparams, state, tokens_BxS, lengths_B) -> state
      Called after every commit (the first token, then each accepted block with
      its corrected or bonus token), so the drafter's own state sees every
      committed token before it drafts again.
  propose(dparams, state, tokens_BxS, lengths_B, keys_B, sampling, gamma,
          target_params, target_cache) -> (draft_BxG, q_BxGxV | None, state, target_cache)
      Proposes gamma tokens after each row's last committed token, with q, the
      distribution each draft token was drawn from; None for a deterministic
      drafter, whose q is one-hot. Only the early-exit drafter touches the
      target's cache (it shares its first layers' KV); others return it as is.

All functions run inside the one compiled decoding loop, so shapes are fixed
and the number of accepted tokens is data. No registry: `specjax.drafters.make_drafter`
is a plain function that builds one of these by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True, eq=False)
class Drafter:
  name: str
  vocab_size: int | None      # None: proposes ids from the context (n-gram)
  init: Callable[..., Any]
  update: Callable[..., Any]
  propose: Callable[..., Any]
  params: Any = None          # the drafter's own weights (None for n-gram / early exit)


def no_state_init(dparams, tokens_BxS, lengths_B, prefill_len, target_cache):
  del dparams, tokens_BxS, lengths_B, prefill_len, target_cache
  return ()


def no_state_update(dparams, state, tokens_BxS, lengths_B):
  del dparams, tokens_BxS, lengths_B
  return state
