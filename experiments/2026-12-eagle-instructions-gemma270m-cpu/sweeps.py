r"""Spec-Bench cells comparing the shipped EAGLE drafter (the one the instructions recipe made,
`python -m specjax.train --config=configs/train_eagle.py:instructions`) with the drafter it
continued, alone and inside the hybrid, beside n-gram lookup, greedy then sampled at T = 1. The base config is
configs/paper_tables.py:spec_bench (raw text, 2 prompts per task, 64 new tokens); every cell
drafts at most 4 tokens a call with the adaptive length, and each temperature's cells share
one autoregressive baseline. Run it with --config=<this file>:chains, the Spec-Bench
question file as --config.prompts and an --config.output_dir of its own (e.g.
results/eagle-instructions/chains), then `python -m specjax.report` on that directory. The
drafter before it is the one shipped at c7e7cbf; write it where PREVIOUS points first:

    mkdir -p results/eagle-previous
    git archive c7e7cbf specjax/drafters/data/gemma3-270m-eagle | tar -x -C results/eagle-previous
"""

import os
import runpy

_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'configs',
                       'paper_tables.py')

SWEEPS = ('chains',)
# The drafter the instructions recipe continued (shipped until 89bf233); see the docstring.
PREVIOUS = 'results/eagle-previous/specjax/drafters/data/gemma3-270m-eagle'


def get_config(arg=None):
  if arg not in SWEEPS:
    raise ValueError(f'name a sweep: {", ".join(SWEEPS)} (e.g. sweeps.py:chains), got {arg!r}')
  return runpy.run_path(_TABLES)['get_config']('spec_bench')


def get_sweep(arg=None):
  del arg
  cells = []
  for temperature in (0.0, 1.0):
    cells.append(dict(drafters=('ngram',), gamma=4, temperature=temperature))
    for checkpoint in ('embedded', PREVIOUS):
      cells += [{'drafters': (name,), 'gamma': 4, 'temperature': temperature,
                 'eagle.checkpoint': checkpoint} for name in ('eagle', 'hybrid')]
  return cells
