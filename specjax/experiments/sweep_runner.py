"""`run_sweep(config, cells)`: one experiment per cell, each recorded as soon as it ends.

The library function behind `python -m specjax.sweep`. Every cell is checked
first (`sweep_cells.expand`); then the cells not yet in `cells.jsonl` run in
order. Cells that differ only in drafter settings share a run directory, so
the autoregressive baseline of the same prompts runs once. A cell that raises
is recorded with its error and the sweep goes on; progress (cells done, time
spent, time left) goes to the absl log. `sweep.md` tabulates the last record
of every cell when the sweep ends. Compiled programs are dropped after each
cell, so a sweep's memory does not grow with its length.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging
import jax

from specjax import experiment
from specjax.experiments import summary as summary_lib
from specjax.experiments import sweep_cells
from specjax.experiments import sweep_records
from specjax.experiments.config import BASELINE

_TRACEBACK_LINES = 30  # of a failed cell's traceback, kept in its record


def run_sweep(config: Mapping[str, Any], sweep: Sequence[Mapping[str, Any]]
              ) -> list[dict[str, Any]]:
  """Runs every cell of `sweep` (dicts of overrides of `config`) into config.output_dir.

  Returns the last record of each cell, in sweep order.
  """
  base = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  cells = sweep_cells.expand(base, sweep)
  directory = sweep_records.SweepDir(base['output_dir'], base)
  done = directory.finished()
  todo = [cell for cell in cells if cell.id not in done]
  logging.info('sweep of %d cells in %s: %d done already, %d to run', len(cells), directory.dir,
               len(cells) - len(todo), len(todo))
  provenance = sweep_records.provenance() if todo else {}
  started = time.monotonic()
  for number, cell in enumerate(todo, start=1):
    logging.info('cell %s (%d of %d to run): %s', cell.id, number, len(todo), cell.label)
    directory.append(_run_cell(cell, directory, provenance))
    # Cells share no compiled program worth keeping (a reused baseline is reused as
    # rows), and a long sweep that held every cell's programs crashed XLA:CPU in a
    # later compile (SIGSEGV in the 11th cell of the Leviathan table). The
    # persistent compilation cache still serves a program a later cell needs again.
    jax.clear_caches()
    spent = time.monotonic() - started
    logging.info('%d of %d cells done; %s spent in this run, about %s left',
                 len(cells) - len(todo) + number, len(cells), _duration(spent),
                 _duration(spent / number * (len(todo) - number)))
  latest = directory.latest()
  records = [latest[cell.id] for cell in cells]
  table = markdown(records)
  (directory.dir / sweep_records.TABLE).write_text(table, encoding='utf-8')
  print(f'\n{table}\nWritten to {directory.dir}/')
  return records


def _run_cell(cell: sweep_cells.Cell, directory: sweep_records.SweepDir,
              provenance: dict[str, Any]) -> dict[str, Any]:
  run_dir = directory.run_dir(cell.experiment.fingerprint(BASELINE))
  record = dict(cell=cell.id, label=cell.label, overrides=cell.overrides, run_dir=run_dir)
  started = time.monotonic()
  try:
    summary, rows = experiment.run_experiment_with_rows(
        {**cell.config, 'output_dir': run_dir, 'resume': True})
  except Exception as e:  # pylint: disable=broad-except  # recorded; the sweep goes on
    logging.error('cell %s (%s) failed: %s: %s', cell.id, cell.label, type(e).__name__, e)
    lines = traceback.format_exc().splitlines()[-_TRACEBACK_LINES:]
    return dict(record, status='error', error=f'{type(e).__name__}: {e}',
                traceback='\n'.join(lines), wall_s=time.monotonic() - started,
                date=sweep_records.now(), **provenance)
  return dict(record, status='ok', error=None, wall_s=time.monotonic() - started,
              date=sweep_records.now(), **provenance, prompt_format=summary['prompt_format'],
              methods=summary['methods'], categories=summary['categories'], rows=rows)


def markdown(records: Sequence[dict[str, Any]]) -> str:
  """One table line per cell and method; failed cells listed with their errors."""
  figures = {f'{r["label"]}: {method}': fig for r in records if r['status'] == 'ok'
             for method, fig in r['methods'].items()}
  parts = ['# Sweep', '', experiment.TIMING_NOTE, '', summary_lib.table(figures)]
  failed = [r for r in records if r['status'] != 'ok']
  if failed:
    parts += ['', '## Failed cells', ''] + [f'- {r["label"]}: {r["error"]}' for r in failed]
  return '\n'.join(parts) + '\n'


def _duration(seconds: float) -> str:
  minutes, seconds = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{seconds:02d}s'
