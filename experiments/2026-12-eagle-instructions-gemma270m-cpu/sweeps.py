r"""This folder's Spec-Bench table: the shipped EAGLE drafter against the one continued on
the instructions recipe (configs/train_eagle.py:instructions), alone and inside the hybrid,
greedy and sampled (T = 1), beside n-gram lookup, on configs/paper_tables.py:spec_bench (raw
text, 2 prompts per task, 64 new tokens, gamma 4, adaptive draft length). One baseline per
temperature, shared by its cells.

  python -m specjax.sweep \
      --config=experiments/2026-12-eagle-instructions-gemma270m-cpu/sweeps.py:chains \
      --config.prompts=../shared/data/spec_bench_question.jsonl \
      --config.output_dir=results/eagle-instructions/chains
  python -m specjax.report results/eagle-instructions/chains
"""

import importlib.util
import os

_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'configs',
                       'paper_tables.py')
_spec = importlib.util.spec_from_file_location('specjax_paper_tables_config', _TABLES)
paper_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_tables)

SWEEPS = ('chains',)
# What `python -m specjax.train --config=configs/train_eagle.py:instructions` writes.
CONTINUED = 'results/train_eagle-instructions/drafter'


def get_config(arg=None):
  if arg not in SWEEPS:
    raise ValueError(f'name a sweep: {", ".join(SWEEPS)} (e.g. sweeps.py:chains), got {arg!r}')
  return paper_tables.get_config('spec_bench')


def get_sweep(arg=None):
  del arg
  cells = []
  for temperature in (0.0, 1.0):
    cells.append(dict(drafters=('ngram',), gamma=4, temperature=temperature))
    for checkpoint in ('embedded', CONTINUED):
      cells += [{'drafters': (name,), 'gamma': 4, 'temperature': temperature,
                 'eagle.checkpoint': checkpoint} for name in ('eagle', 'hybrid')]
  return cells
