r"""What drawing a token costs: one exponential race over the vocabulary against two over
its blocks (`sampling.sample`), alone and in the sampled loop.

`sampling.sample` draws i with probability w_i / sum(w) as argmax(w / E), E ~ Exp(1).
Until 7 December 2026 it raced all V = 262,144 tokens of Gemma's vocabulary, V
exponentials a row; now a race over the blocks' sums picks a block and a second race
inside it picks the token, 2 sqrt(V) exponentials (exact: w_i / S_b times S_b / S).
This prints, with the CPU model and flags:

1. ms for a draw over V for B rows (`--rows`), in interleaved rounds: the one race (as it
   was, written out here), the two races, and the whole `draw` at temperature 1
   (softmax, then the two races).
2. The sampled loop (temperature 1, batch 1, the first prompt of `--tasks` Spec-Bench
   tasks, raw text, `--max_new_tokens`): autoregressive decoding and `ngram` with each
   sampler, in interleaved rounds, as time over the two-race autoregressive run. The one
   race is traced into its own programs by patching `sampling.sample` while they
   compile, with top_k = V (the filter off, the same distribution) so that they are
   cached apart from the two-race programs. Sampled outputs differ between samplers (the
   draws differ), so they are not compared; tests/test_acceptance.py checks both
   distributions.

  .venv/bin/python benchmarks/sampling_cost.py
  .venv/bin/python benchmarks/sampling_cost.py --rows=1,5 --tasks=13 --repeats=3
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specjax import argmax as argmax_lib
from specjax import sampling as sampling_lib
from specjax.decoding import autoregressive, program, speculative
from specjax.drafters import make_drafter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import served  # noqa: E402  pylint: disable=g-import-not-at-top

ROWS = flags.DEFINE_list('rows', ['1', '5', '20', '32'], 'Rows a draw takes, part 1.')
VOCAB = flags.DEFINE_integer('vocab', 262144, 'Vocabulary of part 1 (Gemma 3: 262,144).')
PROMPTS = flags.DEFINE_string('prompts', served.SPEC_BENCH, 'Spec-Bench question.jsonl.')
TASKS = flags.DEFINE_integer('tasks', 6, 'Part 2: the first prompt of this many tasks (0: '
                             'skip part 2).')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Part 2: tokens generated per prompt.')
GAMMA = flags.DEFINE_integer('gamma', 4, 'Part 2: the most drafts per call of `ngram`.')
REPEATS = flags.DEFINE_integer('repeats', 5, 'Interleaved timed rounds (after a first).')


def one_race(keys_B, weights_BxV):
  """`sampling.sample` before 7 December 2026: one race over the whole vocabulary."""
  def row(key, w):
    race = jax.random.exponential(key, w.shape, dtype=jnp.float32)
    return argmax_lib.argmax(jnp.where(w > 0, w / race, -1.0))
  return jax.vmap(row)(keys_B, weights_BxV)


def _kernel_table():
  t1 = sampling_lib.SamplingConfig(temperature=1.0)
  fns = {'one race': jax.jit(one_race), 'two races': jax.jit(sampling_lib.sample),
         'draw at T = 1 (softmax + two races)':
             jax.jit(lambda k, logits: sampling_lib.draw(k, logits, t1)[0])}
  print(f'\n1. A draw over {VOCAB.value:,} tokens, ms (median of {REPEATS.value} interleaved '
        'rounds of 10 draws)\n')
  print('| rows | ' + ' | '.join(fns) + ' |')
  print('|---|' + '---|' * len(fns))
  for rows in (int(r) for r in ROWS.value):
    keys = sampling_lib.row_keys(0, range(rows))
    logits = jax.random.normal(jax.random.key(1), (rows, VOCAB.value))
    probs = sampling_lib.probabilities(logits, t1)
    args = {name: (keys, logits if name.startswith('draw') else probs) for name in fns}
    for name, fn in fns.items():
      fn(*args[name]).block_until_ready()
    ms = {name: [] for name in fns}
    for _ in range(REPEATS.value):
      for name, fn in fns.items():
        start = time.perf_counter()
        for _ in range(10):
          out = fn(*args[name])
        out.block_until_ready()
        ms[name].append((time.perf_counter() - start) * 100)
    print(f'| {rows} | ' + ' | '.join(f'{np.median(ms[n]):.2f}' for n in fns) + ' |')


def _loop_table():
  chosen, model, params, ids = served.start(PROMPTS.value, TASKS.value)
  vocab = model.config.vocab_size
  gamma, max_new = GAMMA.value, MAX_NEW.value
  packed = [program.pack(model, one, max_new_tokens=max_new, extra_slots=gamma + 1)
            for one in ids]
  ngram = make_drafter('ngram', target=model)
  samplers = {'two races': sampling_lib.SamplingConfig(temperature=1.0),
              'one race': sampling_lib.SamplingConfig(temperature=1.0, top_k=vocab)}

  def over_prompts(generate):
    outs = [generate(i) for i in range(len(ids))]
    return (np.array([o.wall_s for o in outs]), None,
            sum(sum(getattr(o, 'target_calls', [0])) for o in outs))

  runs = {}
  for label, sampling in samplers.items():
    runs[f'autoregressive, {label}'] = lambda s=sampling: over_prompts(
        lambda i: autoregressive.generate(model, params, packed[i], max_new_tokens=max_new,
                                          sampling=s, seed=i))
    runs[f'ngram, {label}'] = lambda s=sampling: over_prompts(
        lambda i: speculative.generate(model, params, ngram, packed[i], gamma=gamma,
                                       max_new_tokens=max_new, sampling=s, seed=i))
  first = {}
  library_sample = sampling_lib.sample
  for name, run in runs.items():   # compiles each: the one race's programs with it patched in
    sampling_lib.sample = one_race if name.endswith('one race') else library_sample
    try:
      first[name] = run()
    finally:
      sampling_lib.sample = library_sample
  seconds = {name: [] for name in runs}
  for _ in range(REPEATS.value):
    for name, run in runs.items():
      seconds[name].append(float(run()[0].sum()))
  base = np.median(seconds['autoregressive, two races'])
  print(f'\n2. The sampled loop: Gemma 3 270M float32 (served with its int8 forms), '
        f'temperature 1, batch 1, {len(ids)} prompts '
        f'({", ".join(p.category for p in chosen)}), {max_new} new tokens, `ngram` gamma '
        f'{gamma} adaptive; median of {REPEATS.value} interleaved rounds\n')
  print('| run | time over two-race autoregressive | target calls |')
  print('|---|---|---|')
  for name in runs:
    print(f'| {name} | {np.median(seconds[name]) / base:.3f} | {first[name][2] or "-"} |')


def main(argv):
  del argv
  print(cpu_info.describe())
  _kernel_table()
  if TASKS.value:
    _loop_table()


if __name__ == '__main__':
  app.run(main)
