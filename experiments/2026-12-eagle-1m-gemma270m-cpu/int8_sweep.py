r"""EAGLE's layer in float32 and as int8 blocks (eagle.weights), with `ngram` as a control.

configs/paper_tables.py:spec_bench (raw text, 2 per task, 64 new tokens, gamma 4,
adaptive draft length), one baseline:

  python -m specjax.sweep --config=experiments/2026-12-eagle-1m-gemma270m-cpu/int8_sweep.py \
      --config.prompts=../shared/data/spec_bench_question.jsonl \
      --config.output_dir=results/eagle-1m/int8
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
  return [dict(drafters=('ngram',), gamma=4),
          dict(drafters=('eagle',), gamma=4, eagle=dict(weights='int8'),
               draft_length=dict(adaptive=False)),
          dict(drafters=('eagle',), gamma=4, eagle=dict(weights='int8')),
          dict(drafters=('hybrid',), gamma=4, eagle=dict(weights='int8')),
          dict(drafters=('eagle',), gamma=4, eagle=dict(weights='float32')),
          dict(drafters=('hybrid',), gamma=4, eagle=dict(weights='float32'))]
