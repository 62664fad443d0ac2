r"""Markdown tables and PNG plots from a results directory alone: `python -m specjax.report DIR`.

Reads every `*.jsonl` of rows in DIR (`results.jsonl`, a sweep's rows) and
writes DIR/report/report.md with five tables and their plots: speedup against
gamma, mean accepted tokens per task, acceptance by draft position, predicted
(Leviathan et al. 2023) against measured speedup, and speedup against batch
size; then the paper tables (`reports/paper.py`): Leviathan et al.'s Table 2,
Chen et al.'s ms/token and, for Spec-Bench prompts, its leaderboard. Nothing is rerun, so a report can be made anywhere the rows are.

  python -m specjax.report results/gemma
  python -m specjax.report results/sweep --cost_ratio=ngram=0,early_exit=0.25 --out=/tmp/r

The prediction needs each drafter's cost per draft step in target calls (c):
n-gram lookup costs next to nothing (c = 0, the default); give others with
`--cost_ratio`, or they are left out of that table. Plots need matplotlib
(`pip install -e '.[report]'`); `--noplots` writes the Markdown alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from absl import app
from absl import flags
from absl import logging

from specjax.reports import figures as figures_lib
from specjax.reports import markdown as md
from specjax.reports import paper
from specjax.reports.rows import ReportError, read_rows

DEFAULT_COST_RATIOS = {'ngram': 0.0}
REPORT_MD = 'report.md'


def write_report(directory: str, out_dir: str | None = None,
                 cost_ratios: Mapping[str, float] = DEFAULT_COST_RATIOS, plots: bool = True,
                 command: str | None = None) -> str:
  """Writes report.md (and the plots) for the rows in `directory`; returns report.md's path.

  `out_dir` defaults to `directory/report`; `command` is the line report.md
  says it came from.
  """
  rows = read_rows(directory)
  out_dir = out_dir or os.path.join(directory, 'report')
  os.makedirs(out_dir, exist_ok=True)
  figs = figures_lib.figures(rows)
  per_task = figures_lib.accepted_per_task(rows)
  preds = figures_lib.predictions(figs, cost_ratios)
  by_batch = figures_lib.speedup_by_batch_size(figs)
  varies = (len({r.temperature for r in rows}) > 1, len({r.batch_size for r in rows}) > 1)
  images = {}
  if plots:
    from specjax.reports import plots as plots_lib  # pylint: disable=g-import-not-at-top
    images = plots_lib.write_all(out_dir, figs, per_task, preds, by_batch, varies)

  files = sorted({r.where.rsplit(':', 1)[0] for r in rows})
  counts = ', '.join(f'{os.path.basename(f)} ({sum(r.where.startswith(f + ":") for r in rows)})'
                     for f in files)
  costs = ', '.join(f'{m} {c:g}' for m, c in sorted(cost_ratios.items())) or 'none given'
  sections = [
      ('Speedup against gamma', 'gamma', md.speedup_table(figs)),
      ('Mean accepted tokens per task', 'task',
       ['New tokens per target call (prefill included) of each speculative setting, by task.', '',
        *md.per_task_table(per_task, varies)]),
      ('Acceptance by draft position', 'position',
       ['How often draft position i was accepted, per verify call; i.i.d. acceptance would give '
        'alpha^i.', '', *md.by_position_table(figs)]),
      ('Predicted against measured speedup', 'predicted',
       [f'Predicted: (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) (Leviathan et al. 2023, '
        f'Theorem 3.8), with c, the cost of a draft step in target calls: {costs}. It ignores '
        'prefill and takes a verify call to cost one decode step.', '',
        *md.prediction_table(preds)]),
      ('Speedup against batch size', 'batch',
       ['Each over the baseline at the same batch size.', '', *md.batch_table(by_batch)]),
      ('Paper table: Leviathan et al. 2023, Table 2', 'leviathan',
       ['Per task: alpha measured as above, the measured speedup, and the walltime improvement '
        'Theorem 3.8 predicts from that alpha and c (blank without a c).', '',
        *paper.leviathan_table(rows, cost_ratios)]),
      ('Paper table: Chen et al. 2023, Table 1', 'chen',
       ['Milliseconds per new token (total wall time over total new tokens) of each method, '
        'by sampling setting.', '', *paper.chen_table(rows)]),
  ]
  if paper.covers_spec_bench(rows):
    sections.append(
        ('Paper table: the Spec-Bench leaderboard', 'spec_bench',
         ["Speedup per Spec-Bench task group (its eight MT-bench categories form "
          "'multi-turn conversation'); '-' where the rows hold none of the group.", '',
          *paper.spec_bench_table(rows)]))
  lines = [
      f'# Report: {os.path.basename(os.path.normpath(directory))}', '',
      f'Command: `{command or f"write_report({directory!r})"}`  ',
      f'Rows: {len(rows)}, from {counts}.', '',
      "Speedup is a setting's tokens/s (total new tokens over total wall time) over the "
      "autoregressive baseline's at the same temperature and batch size, on the prompts both ran. "
      'Mean accepted tokens counts the corrected or bonus token, so plain decoding scores 1.00. '
      'alpha is the per-draft acceptance probability under which i.i.d. acceptance gives the '
      'measured accepted drafts per verify call (a call that verified drafts: neither the '
      'prefill nor a plain decoding step); a token tree has none. gamma is the drafts per '
      "call of a chain, or a tree's nodes/depth ('tree 25/5'); there, position i is depth i.",
  ]
  for title, key, body in sections:
    lines += ['', f'## {title}', '', *body]
    if key in images:
      lines += ['', f'![{title}]({images[key]})']
  path = os.path.join(out_dir, REPORT_MD)
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')
  return path


def parse_cost_ratios(text: str) -> dict[str, float]:
  """'ngram=0,early_exit=0.25' -> {'ngram': 0.0, 'early_exit': 0.25}."""
  out = {}
  for part in filter(None, text.split(',')):
    method, _, value = part.partition('=')
    try:
      cost = float(value)
    except ValueError:
      cost = -1.0
    if not method.strip() or not cost >= 0:
      raise ReportError(f'--cost_ratio takes method=c pairs with c >= 0, got {part!r}')
    out[method.strip()] = cost
  return out


def main(argv):
  if len(argv) != 2:
    raise app.UsageError('usage: python -m specjax.report DIR [--out=...] [--cost_ratio=...]')
  try:
    path = write_report(argv[1], flags.FLAGS.out, parse_cost_ratios(flags.FLAGS.cost_ratio),
                        flags.FLAGS.plots,
                        command='python -m specjax.report ' + ' '.join(sys.argv[1:]))
  except ReportError as e:  # the user's to fix: no traceback
    sys.exit(f'error: {e}')
  logging.info('wrote %s', path)
  print(f'Written to {path}')


if __name__ == '__main__':
  # Defined here, not on import: a notebook imports write_report alone.
  flags.DEFINE_string('out', None, 'Where report.md and the plots go (default DIR/report).')
  flags.DEFINE_string('cost_ratio', 'ngram=0',
                      'method=c pairs: a draft step of the method costs c target calls.')
  flags.DEFINE_bool('plots', True, 'Write PNG plots (needs matplotlib).')
  app.run(main)
