r"""Spec-Bench cells for the drafter the requests recipe made
(`python -m specjax.train --config=configs/train_eagle.py:requests`) against the one it
continued (the instructions recipe's, results/train_eagle-instructions/drafter), greedy.
The base config is configs/paper_tables.py:spec_bench (raw text, 2 prompts per task, 64 new
tokens); the cells share one autoregressive baseline.

- `chain`: each drafter alone as a fixed chain of 4 (`draft_length.adaptive=False`), what
  #8's 2.5 goal reads;
- `served`: n-gram lookup, then EAGLE and the hybrid with each drafter, gamma 4 with the
  adaptive length, as the default run serves them.

Run it with --config=<this file>:<sweep>, the Spec-Bench question file as --config.prompts
and an --config.output_dir of its own, then `python -m specjax.report` on that directory.
Before the new drafter ships, NEW is where the run wrote it; after, 'embedded' is the same.
"""

import os
import runpy

_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'configs',
                       'paper_tables.py')

SWEEPS = ('chain', 'served')
NEW = 'results/train_eagle-requests/drafter'
PREVIOUS = 'results/train_eagle-instructions/drafter'


def get_config(arg=None):
  if arg not in SWEEPS:
    raise ValueError(f'name a sweep: {", ".join(SWEEPS)} (e.g. sweeps.py:chain), got {arg!r}')
  return runpy.run_path(_TABLES)['get_config']('spec_bench')


def get_sweep(arg=None):
  if arg == 'chain':
    return [{'drafters': ('eagle',), 'gamma': 4, 'draft_length.adaptive': False,
             'eagle.checkpoint': checkpoint} for checkpoint in (NEW, PREVIOUS)]
  cells = [dict(drafters=('ngram',), gamma=4)]
  for checkpoint in (NEW, PREVIOUS):
    cells += [{'drafters': (name,), 'gamma': 4, 'eagle.checkpoint': checkpoint}
              for name in ('eagle', 'hybrid')]
  return cells
