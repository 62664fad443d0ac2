r"""What the speculative loop costs over autoregressive decoding when it never drafts.

The adaptive draft-length policy takes a plain step (one position, no drafts)
where no row has evidence, and at batch 4 and more on a 2-core CPU it takes
almost nothing else, so there the loop's speed over autoregressive decoding is
that of its plain step over a decode step: what the n-gram search, the
policy's choice and the loop's bookkeeping add. Spec-Bench-style runs measure
it only within their run-to-run spread (0.96x-1.01x on such batches). This
times, interleaved, the same prompts decoded by `autoregressive.generate` and
by `speculative.generate` with `ngram` under an adaptive policy whose costs
forbid drafting (buckets 0, 2, 4, 6; a call of drafts priced at 50+ decode
steps), for each batch size, and prints the ratio of their median and fastest
times with the CPU model and flags. Outputs are checked identical. With
`--drafters=ngram,eagle,hybrid` it times the never-drafting loop of each: a
loop carrying the shipped EAGLE drafter also asks the target for its features
and runs the drafter's update after every call, drafting or not.

Gemma 3 270M (the embedded GGUF, float32, served as the product serves it),
greedy, raw-text Spec-Bench prompts (first turn, one per task in turn).

  .venv/bin/python benchmarks/plain_step_overhead.py --batch_sizes=1,4,8 --repeats=7
  .venv/bin/python benchmarks/plain_step_overhead.py --batch_sizes=1 --drafters=ngram,eagle,hybrid
"""

from __future__ import annotations

import collections
import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

from specjax import compile_cache
from specjax.decoding import autoregressive, draft_length, speculative
from specjax.drafters import make_drafter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import served  # noqa: E402  pylint: disable=g-import-not-at-top

PROMPTS = flags.DEFINE_string('prompts', served.SPEC_BENCH, 'Spec-Bench question.jsonl.')
BATCH_SIZES = flags.DEFINE_list('batch_sizes', ['1', '4', '8'], 'Batch sizes.')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Tokens generated per row.')
REPEATS = flags.DEFINE_integer('repeats', 7, 'Interleaved timed runs of each (after a first).')
DRAFTERS = flags.DEFINE_list('drafters', ['ngram'],
                             'Drafters whose never-drafting loop is timed: ngram, eagle, hybrid '
                             '(over the shipped EAGLE drafter).')

# Drafting priced out: every call with drafts costs 50+ decode steps, so the policy
# never pays for one and every step is plain.
NEVER_DRAFTS = draft_length.Policy(buckets=(0, 2, 4, 6), costs=(1.0, 50.0, 60.0, 70.0))


def main(argv):
  del argv
  compile_cache.enable()
  print(cpu_info.describe())
  prompts = served.spec_bench_prompts(PROMPTS.value)
  model, params, tokenizer = served.target()
  by_task = collections.defaultdict(list)
  for p in prompts:
    by_task[p.category].append(p)
  # One prompt per task in turn, so a batch mixes tasks and lengths.
  order = [p for rank in range(max(map(len, by_task.values())))
           for task in by_task.values() if rank < len(task) for p in task[rank:rank + 1]]
  trained = served.shipped_eagle(model) if {'eagle', 'hybrid'} & set(DRAFTERS.value) else None
  loops = {name: make_drafter(name, target=model, trained=trained, target_params=params)
           for name in DRAFTERS.value}
  print(f'jax {jax.__version__}, Gemma 3 270M float32, greedy, {MAX_NEW.value} new tokens, '
        f'{REPEATS.value} interleaved runs each\n')
  print('| batch | drafter | autoregressive s (median / fastest) | never-drafting loop s '
        '(median / fastest) | loop / autoregressive, median | fastest |')
  print('|---|---|---|---|---|---|')
  for batch in (int(b) for b in BATCH_SIZES.value):
    ids = [tokenizer.encode(p.text, add_bos=True) for p in order[:batch]]
    runs = {'ar': lambda ids=ids: autoregressive.generate(model, params, ids,
                                                          max_new_tokens=MAX_NEW.value)}
    for name, drafter in loops.items():
      runs[name] = lambda ids=ids, drafter=drafter: speculative.generate(
          model, params, drafter, ids, gamma=6, max_new_tokens=MAX_NEW.value,
          policy=NEVER_DRAFTS)
    first = {name: run() for name, run in runs.items()}   # compiles
    for name in loops:
      if first['ar'].new_tokens != first[name].new_tokens:
        sys.exit(f'batch {batch}: the never-drafting {name} loop differs from autoregressive '
                 'decoding')
    seconds = collections.defaultdict(list)
    for _ in range(REPEATS.value):
      for name, run in runs.items():
        seconds[name].append(run().wall_s)
    ar = np.asarray(seconds['ar'])
    for name in loops:
      loop = np.asarray(seconds[name])
      print(f'| {batch} | {name} | {np.median(ar):.3f} / {ar.min():.3f} | {np.median(loop):.3f} / '
            f'{loop.min():.3f} | {np.median(loop) / np.median(ar):.3f} | '
            f'{loop.min() / ar.min():.3f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
