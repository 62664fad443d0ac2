"""Per-method and per-category figures from the result rows, as JSON and Markdown.

Tokens/s is total new tokens over total wall time, so long generations weigh
more than short ones; speedup is that figure over the baseline's on the same
prompts. Mean accepted tokens counts the corrected or bonus token, so plain
decoding would score 1.00 (Spec-Bench's convention).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from specjax.experiments.config import BASELINE


def summarize(rows: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
  by_method = collections.defaultdict(list)
  for row in rows:
    by_method[row['method']].append(row)
  categories = sorted({row['category'] for row in rows})
  return {
      'methods': _figures(by_method, methods),
      'categories': {
          category: _figures({m: [r for r in rs if r['category'] == category]
                              for m, rs in by_method.items()}, methods)
          for category in categories},
  }


def _figures(by_method, methods) -> dict[str, dict[str, Any]]:
  out = {}
  for method in methods:
    rows = by_method.get(method, [])
    new_tokens = sum(r['new_tokens'] for r in rows)
    wall_s = sum(r['wall_s'] for r in rows)
    fig = {'prompts': len(rows), 'new_tokens': new_tokens, 'wall_s': round(wall_s, 4),
           'tokens_per_s': new_tokens / wall_s if wall_s else None}
    if method != BASELINE and rows:
      drafted = sum(r['drafted_tokens'] for r in rows)
      calls = sum(r['target_calls'] for r in rows)
      # Calls that verified drafts: neither the prefill nor a plain step. A tree call
      # verifies many nodes per depth and an adaptive call fewer than gamma, so count
      # the calls; rows from before plain_calls was recorded drafted gamma per call.
      if all(r.get('plain_calls') is not None for r in rows):
        verify_calls = sum(r['target_calls'] - r['plain_calls'] - 1 for r in rows)
      else:
        verify_calls = drafted // rows[0]['gamma']
      at_position = [sum(col) for col in zip(*(r['acceptance_by_position'] for r in rows))]
      fig.update(
          gamma=rows[0]['gamma'],
          # How often draft position i was accepted, per verify call.
          acceptance_by_position=[a / verify_calls for a in at_position] if verify_calls else None,
          acceptance_rate=sum(r['accepted_tokens'] for r in rows) / drafted if drafted else None,
          mean_accepted_tokens=new_tokens / calls if calls else None,
          identical_fraction=sum(bool(r['identical_to_baseline']) for r in rows) / len(rows))
    out[method] = fig
  base = out.get(BASELINE, {}).get('tokens_per_s')
  for fig in out.values():
    fig['speedup'] = fig['tokens_per_s'] / base if base and fig['tokens_per_s'] else None
  return out


_COLUMNS = (('prompts', '{:d}'), ('new_tokens', '{:d}'), ('tokens_per_s', '{:.1f}'),
            ('speedup', '{:.2f}x'), ('acceptance_rate', '{:.3f}'),
            ('mean_accepted_tokens', '{:.2f}'), ('identical_fraction', '{:.2f}'))


def table(figures: dict[str, dict[str, Any]]) -> str:
  """A Markdown table, one line per method; '-' where a figure does not apply."""
  header = '| method | ' + ' | '.join(name for name, _ in _COLUMNS) + ' |'
  lines = [header, '|' + '---|' * (len(_COLUMNS) + 1)]
  for method, fig in figures.items():
    cells = [fmt.format(fig[name]) if fig.get(name) is not None else '-' for name, fmt in _COLUMNS]
    lines.append(f'| {method} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def markdown(summary: dict[str, Any]) -> str:
  parts = [f'# {summary["title"]}', '', summary['timing'], '']
  if 'prompt_format' in summary:  # summaries written before it was recorded lack it
    parts += [f'Prompt format: {summary["prompt_format"]["reason"]}', '']
  parts += [f'Command: `{summary["command"]}`', '', table(summary['methods'])]
  if summary.get('skipped'):
    parts += ['', f'Skipped, too long for the KV cache (in no figure): '
                  f'{", ".join(summary["skipped"])}.']
  for category, figures in summary['categories'].items():
    parts += ['', f'## {category}', '', table(figures)]
  return '\n'.join(parts) + '\n'
