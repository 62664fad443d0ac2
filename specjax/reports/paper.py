"""Three published tables, in their papers' formats, from result rows alone.

- Leviathan et al. 2023, Table 2: per task, drafter, temperature and gamma,
  the measured acceptance rate alpha and speedup, beside the walltime
  improvement their Theorem 3.8 predicts from that alpha and the drafter's
  cost c (a draft step in target calls).
- Spec-Bench (Xia et al. 2024), its leaderboard: speedup per task group
  (the eight MT-bench categories are one group, "multi-turn conversation"),
  mean accepted tokens and the overall speedup, one line per drafter.
- Chen et al. 2023, Table 1: ms per token of autoregressive against
  speculative sampling, one line per sampling setting (greedy, nucleus).

Every figure is a ratio of totals over the prompts a setting and its baseline
both ran (`figures.speedup`), so a task's speedup is its tokens/s over the
baseline's on that task. Nothing here runs a model.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence

from specjax.analysis import leviathan
from specjax.experiments.config import BASELINE
from specjax.reports import figures as figures_lib
from specjax.reports import markdown as md
from specjax.reports.rows import Row

# Spec-Bench's task groups, in its leaderboard's column order.
SPEC_BENCH_GROUPS = {
    'multi-turn conversation': ('writing', 'roleplay', 'reasoning', 'math', 'coding',
                                'extraction', 'stem', 'humanities'),
    'translation': ('translation',),
    'summarization': ('summarization',),
    'question answering': ('qa',),
    'mathematical reasoning': ('math_reasoning',),
    'retrieval-aug. generation': ('rag',),
}


def _baselines(rows: Sequence[Row]) -> dict[tuple[float, int], list[Row]]:
  out = collections.defaultdict(list)
  for r in rows:
    if r.method == BASELINE:
      out[r.temperature, r.batch_size].append(r)
  return out


def _speculative_groups(rows: Sequence[Row]):
  return {s: rs for s, rs in figures_lib.group(rows).items() if s.method != BASELINE}


def _sampling_label(rows: Sequence[Row], temperature: float) -> str:
  if temperature == 0:
    return 'greedy'
  top_p = {r.top_p for r in rows if r.top_p is not None}
  top_k = {r.top_k for r in rows if r.top_k}
  parts = [f'T={temperature:g}']
  if top_p and top_p != {1.0}:
    parts.append('nucleus p=' + '/'.join(f'{p:g}' for p in sorted(top_p)))
  if top_k:
    parts.append('top-k=' + '/'.join(str(k) for k in sorted(top_k)))
  return ', '.join(parts)


def leviathan_table(rows: Sequence[Row], cost_ratios: Mapping[str, float]) -> list[str]:
  """Leviathan et al.'s Table 2: task, drafter, T, gamma, alpha, speedup (and the prediction)."""
  baselines = _baselines(rows)
  lines = []
  for setting, members in _speculative_groups(rows).items():
    method, gamma, temperature, batch_size, _ = setting
    baseline = baselines.get((temperature, batch_size), [])
    by_task = collections.defaultdict(list)
    for r in members:
      by_task[r.category].append(r)
    for task in sorted(by_task) + ['all']:
      task_rows = members if task == 'all' else by_task[task]
      alpha = figures_lib.alpha(task_rows, setting)
      measured = figures_lib.speedup(task_rows, baseline)
      cost = cost_ratios.get(method)
      predicted = (leviathan.walltime_improvement(alpha, gamma, cost)
                   if alpha is not None and cost is not None else None)
      lines.append([task, method + ('' if batch_size == 1 else f' (batch {batch_size})'),
                    f'{temperature:g}', setting.shape, md.fmt(alpha, '.2f'),
                    md.fmt(measured, '.2f') + ('x' if measured is not None else ''),
                    md.fmt(cost, 'g'),
                    md.fmt(predicted, '.2f') + ('x' if predicted is not None else '')])
  return md.table(['task', 'drafter', 'T', 'gamma', 'alpha', 'speedup', 'c',
                   'predicted speedup'], lines)


def spec_bench_table(rows: Sequence[Row]) -> list[str]:
  """Spec-Bench's leaderboard: speedup per task group, mean accepted tokens, overall.

  A group the rows do not cover is left blank; a category outside Spec-Bench's
  only counts towards the overall figures.
  """
  baselines = _baselines(rows)
  header = ['drafter', 'T', *SPEC_BENCH_GROUPS, 'mean accepted tokens', 'overall speedup']
  lines = []
  for setting, members in _speculative_groups(rows).items():
    method, gamma, temperature, batch_size, tree = setting
    baseline = baselines.get((temperature, batch_size), [])
    shape = setting.shape if tree else f'gamma {gamma}'
    cells = [f'{method} ({shape}' + ('' if batch_size == 1 else f', batch {batch_size}')
             + ')', f'{temperature:g}']
    for categories in SPEC_BENCH_GROUPS.values():
      group_rows = [r for r in members if r.category in categories]
      value = figures_lib.speedup(group_rows, baseline) if group_rows else None
      cells.append(md.fmt(value, '.2f') + ('x' if value is not None else ''))
    mean_accepted = sum(r.new_tokens for r in members) / sum(r.target_calls for r in members)
    overall = figures_lib.speedup(members, baseline)
    cells += [f'{mean_accepted:.2f}', md.fmt(overall, '.2f') + ('x' if overall else '')]
    lines.append(cells)
  return md.table(header, lines)


def covers_spec_bench(rows: Sequence[Row]) -> bool:
  """Whether the rows hold at least one Spec-Bench task group."""
  categories = {r.category for r in rows}
  return any(categories & set(group) for group in SPEC_BENCH_GROUPS.values())


def chen_table(rows: Sequence[Row]) -> list[str]:
  """Chen et al.'s Table 1: ms/token of autoregressive and speculative sampling, and the ratio."""
  baselines = _baselines(rows)
  lines = []
  for (temperature, batch_size), baseline in sorted(baselines.items()):
    base_rate = figures_lib.tokens_per_s(baseline)
    label = _sampling_label(baseline, temperature)
    if batch_size != 1:
      label += f', batch {batch_size}'
    lines.append([label, BASELINE, '', md.fmt(1e3 / base_rate if base_rate else None, '.1f'),
                  '1.00x'])
    for setting, members in _speculative_groups(rows).items():
      if (setting.temperature, setting.batch_size) != (temperature, batch_size):
        continue
      shared = {r.prompt_id for r in members}
      rate = figures_lib.tokens_per_s(members)
      ratio = figures_lib.speedup(members, [r for r in baseline if r.prompt_id in shared])
      lines.append([label, setting.method, setting.shape,
                    md.fmt(1e3 / rate if rate else None, '.1f'),
                    md.fmt(ratio, '.2f') + ('x' if ratio is not None else '')])
  return md.table(['sampling', 'method', 'gamma', 'ms/token', 'speedup'], lines)
