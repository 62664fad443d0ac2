"""Packing and warm-up: what decides how many programs an experiment compiles.

In an experiment every prompt up to PREFILL_MIN tokens shares one prefill
width (the library's own minimum stays 16); a batch sized
for its run's longest prompt has the run's slot count; a warm-up run is the
same compiled program with a budget of one token per row, and so is a run
with another `max_new_tokens` in the same shape bucket.
"""

from __future__ import annotations

from specjax import drafters
from specjax.decoding import autoregressive
from specjax.decoding import batch as batch_lib
from specjax.decoding import program as program_lib
from specjax.decoding import speculative

import toy_models

TARGET, PARAMS = toy_models.tiny_gemma()


def test_short_prompts_share_one_prefill_width_and_a_run_one_slot_count():
  mins = dict(min_prefill=batch_lib.PREFILL_MIN)
  short = batch_lib.pack([[1] * 5], max_new_tokens=8, max_slots=4096, **mins)
  longer = batch_lib.pack([[1] * 100], max_new_tokens=8, max_slots=4096, **mins)
  assert short.prefill_len == longer.prefill_len == batch_lib.PREFILL_MIN
  assert short.num_slots == 128
  assert batch_lib.pack([[1] * 5], max_new_tokens=8, max_slots=4096).prefill_len == 16
  sized = batch_lib.pack([[1] * 5], max_new_tokens=8, max_slots=4096, run_longest=300)
  assert sized.num_slots == 384 and sized.prefill_len == 16
  assert batch_lib.pack([[1] * 5], max_new_tokens=8, max_slots=200, run_longest=300
                        ).num_slots == 200   # never past the cap
  assert batch_lib.pack([[1] * 200], max_new_tokens=8, max_slots=4096).prefill_len == 256


def test_a_warm_up_run_compiles_the_program_the_timed_run_uses():
  packed = program_lib.pack(TARGET, [[2, 5, 9], [7]], max_new_tokens=6, extra_slots=1)
  before = program_lib._compiled._cache_size()   # pylint: disable=protected-access
  warm = autoregressive.generate(TARGET, PARAMS, packed, max_new_tokens=6, warm_up=True)
  assert [len(t) for t in warm.new_tokens] == [1, 1]
  compiled = program_lib._compiled._cache_size()   # pylint: disable=protected-access
  assert compiled <= before + 1
  out = autoregressive.generate(TARGET, PARAMS, packed, max_new_tokens=6)
  assert program_lib._compiled._cache_size() == compiled   # pylint: disable=protected-access
  assert [len(t) for t in out.new_tokens] == [6, 6]
  assert [t[:1] for t in out.new_tokens] == warm.new_tokens


def test_budgets_in_one_shape_bucket_share_one_program():
  """The token budget is data: 3, 6 and 11 new tokens, autoregressive and speculative,
  are one program each, and every row stops at its budget with the same tokens."""
  prompts = [[2, 5, 9, 2, 5], [7, 1]]
  ngram = drafters.make_drafter('ngram', target=TARGET)
  runs = {
      'autoregressive': lambda n: autoregressive.generate(TARGET, PARAMS, prompts,
                                                          max_new_tokens=n),
      'speculative': lambda n: speculative.generate(TARGET, PARAMS, ngram, prompts, gamma=3,
                                                    max_new_tokens=n),
  }
  longest = runs['autoregressive'](11).new_tokens
  for name, generate in runs.items():
    generate(3)
    compiled = program_lib._compiled._cache_size()   # pylint: disable=protected-access
    for budget in (3, 6, 11):
      out = generate(budget)
      assert out.new_tokens == [t[:budget] for t in longest], (name, budget)
    assert program_lib._compiled._cache_size() == compiled, name   # pylint: disable=protected-access
