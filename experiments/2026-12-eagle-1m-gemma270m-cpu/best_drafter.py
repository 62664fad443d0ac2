r"""The best-trained-drafter table of issue #8 with the 1M-token EAGLE drafter.

configs/paper_tables.py:spec_bench (raw text, 2 prompts per task, 64 new tokens,
gamma 4, adaptive draft length) with these cells, greedy then sampled (T = 1):

  ngram, eagle, hybrid     chains (the adaptive draft length of the default run)
  eagle, hybrid            static EAGLE tree `eagle-25` (25 nodes, depth 5)

  python -m specjax.sweep \
      --config=experiments/2026-12-eagle-1m-gemma270m-cpu/best_drafter.py \
      --config.prompts=../shared/data/spec_bench_question.jsonl \
      --config.output_dir=results/eagle-1m/best_drafter
  python -m specjax.report results/eagle-1m/best_drafter

Its cells.jsonl, sweep.md and report are copied in best-drafter/.
"""

import importlib.util
import os

_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'configs',
                       'paper_tables.py')
_spec = importlib.util.spec_from_file_location('specjax_paper_tables_config', _TABLES)
paper_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_tables)


def get_config(arg=None):
  del arg
  return paper_tables.get_config('spec_bench')


def get_sweep(arg=None):
  del arg
  cells = []
  for temperature in (0.0, 1.0):
    cells += [dict(drafters=(name,), gamma=4, temperature=temperature)
              for name in ('ngram', 'eagle', 'hybrid')]
    cells += [dict(drafters=(name,), tree='eagle-25', temperature=temperature)
              for name in ('eagle', 'hybrid')]
  return cells
