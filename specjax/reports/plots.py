"""A report's figures as PNG plots (matplotlib, the `report` extra).

Drawn on `matplotlib.figure.Figure` directly, not pyplot, so no global state
or GUI backend is involved and a notebook's own figures are left alone.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from specjax.experiments.config import BASELINE
from specjax.reports import figures as figures_lib
from specjax.reports import markdown
from specjax.reports.figures import Figures, Prediction, Setting
from specjax.reports.rows import ReportError

MISSING = ("the report's plots need matplotlib, from specjax's 'report' extra: "
           "pip install -e '.[report]' (or make the Markdown alone with --noplots)")


def _figure(width=6.4, height=4.2):
  try:
    from matplotlib.figure import Figure
  except ImportError as e:
    raise ReportError(f'{MISSING} ({e})') from None
  return Figure(figsize=(width, height), layout='constrained')


def _integer_x(ax) -> None:
  from matplotlib.ticker import MaxNLocator
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, path: str) -> str:
  fig.savefig(path, dpi=100)
  return path


def speedup_vs_gamma(figs: Sequence[Figures], varies, path: str) -> str:
  fig = _figure()
  ax = fig.add_subplot()
  lines = {}
  for f in figs:
    if f.method != BASELINE and f.speedup is not None:
      key = markdown.label(f.setting, varies, with_gamma=False)
      lines.setdefault(key, []).append((f.gamma, f.speedup))
  for key, points in lines.items():
    ax.plot(*zip(*sorted(points)), marker='o', label=key)
  ax.axhline(1.0, color='gray', linestyle=':', linewidth=1)
  _integer_x(ax)
  ax.set(xlabel='gamma (drafts per target call)', ylabel='speedup over autoregressive',
         title='Speedup against gamma')
  if lines:
    ax.legend()
  return _save(fig, path)


def accepted_per_task(per_task: dict[str, dict[Setting, float]], varies, path: str) -> str:
  settings = sorted({s for by_setting in per_task.values() for s in by_setting},
                    key=figures_lib.sort_key)
  tasks = list(per_task)
  fig = _figure(max(6.4, 0.9 * len(tasks) * max(1, len(settings)) ** 0.5), 4.2)
  ax = fig.add_subplot()
  width = 0.8 / max(1, len(settings))
  for i, setting in enumerate(settings):
    ax.bar([t + i * width for t in range(len(tasks))],
           [per_task[task].get(setting, 0.0) for task in tasks], width,
           label=markdown.label(setting, varies))
  ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks, rotation=30, ha='right')
  ax.axhline(1.0, color='gray', linestyle=':', linewidth=1)
  ax.set(ylabel='mean accepted tokens per target call', title='Mean accepted tokens per task')
  if settings:
    ax.legend(fontsize='small')
  return _save(fig, path)


def acceptance_by_position(figs: Sequence[Figures], varies, path: str) -> str:
  """Each setting's measured rate, and dashed, alpha^i: what i.i.d. acceptance would give."""
  fig = _figure()
  ax = fig.add_subplot()
  for f in figs:
    if f.by_position is None:
      continue
    positions = range(1, len(f.by_position) + 1)
    (line,) = ax.plot(positions, f.by_position, marker='o', label=markdown.label(f.setting, varies))
    if f.alpha is not None:
      ax.plot(positions, [f.alpha ** i for i in positions], linestyle='--',
              color=line.get_color(), linewidth=1)
  _integer_x(ax)
  ax.set(xlabel='draft position', ylabel='accepted per verify call', ylim=(0, 1.05),
         title='Acceptance by draft position (dashed: alpha^i)')
  if ax.lines:
    ax.legend(fontsize='small')
  return _save(fig, path)


def predicted_vs_measured(preds: Sequence[Prediction], varies, path: str) -> str:
  fig = _figure(5.2, 5.0)
  ax = fig.add_subplot()
  shown = [p for p in preds if p.measured is not None]
  for p in shown:
    ax.scatter(p.predicted, p.measured, label=markdown.label(p.setting, varies))
  top = max([1.0] + [max(p.predicted, p.measured) for p in shown]) * 1.1
  ax.plot([0, top], [0, top], color='gray', linestyle=':', linewidth=1)
  ax.set(xlim=(0, top), ylim=(0, top), xlabel='predicted speedup (Leviathan et al.)',
         ylabel='measured speedup', title='Predicted against measured speedup')
  if shown:
    ax.legend(fontsize='small')
  return _save(fig, path)


def speedup_vs_batch_size(by_batch, path: str) -> str:
  fig = _figure()
  ax = fig.add_subplot()
  for setting, per_size in by_batch.items():
    sizes = sorted(per_size)
    ax.plot(sizes, [per_size[b] for b in sizes], marker='o',
            label=markdown.label(setting, (True, False)))
  ax.axhline(1.0, color='gray', linestyle=':', linewidth=1)
  _integer_x(ax)
  ax.set(xlabel='batch size', ylabel='speedup over autoregressive at that batch size',
         title='Speedup against batch size')
  if by_batch:
    ax.legend(fontsize='small')
  return _save(fig, path)


def write_all(out_dir: str, figs, per_task, preds, by_batch, varies) -> dict[str, str]:
  """Every plot into out_dir; returns {section: file name}."""
  files = {
      'gamma': speedup_vs_gamma(figs, varies, os.path.join(out_dir, 'speedup_vs_gamma.png')),
      'task': accepted_per_task(per_task, varies, os.path.join(out_dir, 'accepted_per_task.png')),
      'position': acceptance_by_position(figs, varies,
                                         os.path.join(out_dir, 'acceptance_by_position.png')),
      'predicted': predicted_vs_measured(preds, varies,
                                         os.path.join(out_dir, 'predicted_vs_measured.png')),
      'batch': speedup_vs_batch_size(by_batch, os.path.join(out_dir, 'speedup_vs_batch_size.png')),
  }
  return {k: os.path.basename(v) for k, v in files.items()}
