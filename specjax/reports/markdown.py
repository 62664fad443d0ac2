"""A report's figures as Markdown tables; '-' where a figure does not apply."""

from __future__ import annotations

from collections.abc import Sequence

from specjax.experiments.config import BASELINE
from specjax.reports import figures as figures_lib
from specjax.reports.figures import Figures, Prediction, Setting


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  return (['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
          + ['| ' + ' | '.join(row) + ' |' for row in rows])


def fmt(value, spec: str) -> str:
  return '-' if value is None else format(value, spec)


def label(setting: Setting, varies: tuple[bool, bool], with_gamma: bool = True) -> str:
  """'ngram@4' ('eagle@tree 25/5' for a tree of 25 nodes 5 deep; 'eagle tree 25/5' without
  gamma), with the temperature and batch size added where the report has several."""
  text = setting.method
  if setting.method != BASELINE and with_gamma:
    text += f'@{setting.shape}'
  elif setting.tree:
    text += f' {setting.shape}'
  if varies[0]:
    text += f' t={setting.temperature:g}'
  if varies[1]:
    text += f' b={setting.batch_size}'
  return text


def _setting_cells(setting: Setting) -> list[str]:
  return [setting.method, setting.shape if setting.method != BASELINE else '-',
          f'{setting.temperature:g}', str(setting.batch_size)]


_SETTING = ('method', 'gamma', 'temperature', 'batch size')


def speedup_table(figs: Sequence[Figures]) -> list[str]:
  return table(
      (*_SETTING, 'prompts', 'tokens/s', 'speedup', 'acceptance rate', 'mean accepted tokens',
       'alpha'),
      [(*_setting_cells(f.setting), str(f.prompts), fmt(f.tokens_per_s, '.1f'),
        fmt(f.speedup, '.2f') + ('x' if f.speedup is not None else ''),
        fmt(f.acceptance_rate, '.3f'), fmt(f.mean_accepted_tokens, '.2f'), fmt(f.alpha, '.3f'))
       for f in figs])


def per_task_table(per_task: dict[str, dict[Setting, float]], varies) -> list[str]:
  settings = sorted({s for by_setting in per_task.values() for s in by_setting},
                    key=figures_lib.sort_key)
  return table(('task', *(label(s, varies) for s in settings)),
               [(task, *(fmt(by_setting.get(s), '.2f') for s in settings))
                for task, by_setting in per_task.items()])


def by_position_table(figs: Sequence[Figures]) -> list[str]:
  shown = [f for f in figs if f.by_position is not None]
  width = max((len(f.by_position) for f in shown), default=0)
  return table((*_SETTING, *(str(i) for i in range(1, width + 1))),
               [(*_setting_cells(f.setting),
                 *(fmt(f.by_position[i] if i < len(f.by_position) else None, '.3f')
                   for i in range(width))) for f in shown])


def prediction_table(preds: Sequence[Prediction]) -> list[str]:
  return table(
      (*_SETTING, 'alpha', 'c', 'predicted', 'measured', 'measured / predicted'),
      [(*_setting_cells(p.setting), f'{p.alpha:.3f}', f'{p.cost_ratio:g}', f'{p.predicted:.2f}x',
        fmt(p.measured, '.2f') + ('x' if p.measured is not None else ''),
        fmt(p.measured / p.predicted if p.measured is not None else None, '.2f'))
       for p in preds])


def batch_table(by_batch: dict[Setting, dict[int, float]]) -> list[str]:
  sizes = sorted({b for per_size in by_batch.values() for b in per_size})
  return table(('method', 'gamma', 'temperature', *(f'batch {b}' for b in sizes)),
               [(s.method, s.shape, f'{s.temperature:g}',
                 *(fmt(per_size.get(b), '.2f') + ('x' if b in per_size else '') for b in sizes))
                for s, per_size in by_batch.items()])
