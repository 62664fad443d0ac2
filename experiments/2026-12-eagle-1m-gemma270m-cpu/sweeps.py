r"""This folder's two sweeps, on configs/paper_tables.py:spec_bench (raw text, 2 prompts
per task, 64 new tokens, gamma 4, adaptive draft length).

  :best_drafter  issue #8's table with the 1M-token EAGLE drafter, greedy then sampled
                 (T = 1): ngram, eagle and hybrid as chains, eagle and hybrid over the
                 static EAGLE tree `eagle-25` (25 nodes, depth 5). Copied in best-drafter/.
  :int8          EAGLE's layer in float32 and as int8 blocks (eagle.weights), with ngram
                 as a control; eagle int8 also as a fixed chain of 4. Copied in int8/.

  python -m specjax.sweep \
      --config=experiments/2026-12-eagle-1m-gemma270m-cpu/sweeps.py:best_drafter \
      --config.prompts=../shared/data/spec_bench_question.jsonl \
      --config.output_dir=results/eagle-1m/best_drafter
  python -m specjax.report results/eagle-1m/best_drafter
"""

import importlib.util
import os

_TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'configs',
                       'paper_tables.py')
_spec = importlib.util.spec_from_file_location('specjax_paper_tables_config', _TABLES)
paper_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_tables)

SWEEPS = ('best_drafter', 'int8')


def get_config(arg=None):
  if arg not in SWEEPS:
    raise ValueError(f'name a sweep: {", ".join(SWEEPS)} (e.g. sweeps.py:best_drafter), got {arg!r}')
  return paper_tables.get_config('spec_bench')


def get_sweep(arg=None):
  if arg == 'int8':
    return [dict(drafters=('ngram',), gamma=4),
            dict(drafters=('eagle',), gamma=4, eagle=dict(weights='int8'),
                 draft_length=dict(adaptive=False)),
            dict(drafters=('eagle',), gamma=4, eagle=dict(weights='int8')),
            dict(drafters=('hybrid',), gamma=4, eagle=dict(weights='int8')),
            dict(drafters=('eagle',), gamma=4, eagle=dict(weights='float32')),
            dict(drafters=('hybrid',), gamma=4, eagle=dict(weights='float32'))]
  cells = []
  for temperature in (0.0, 1.0):
    cells += [dict(drafters=(name,), gamma=4, temperature=temperature)
              for name in ('ngram', 'eagle', 'hybrid')]
    cells += [dict(drafters=(name,), tree='eagle-25', temperature=temperature)
              for name in ('eagle', 'hybrid')]
  return cells
