"""The figures of a report, computed from rows: speedups, acceptance, predictions.

A setting is (method, gamma, temperature, batch size, tree). Its speedup is its
tokens/s (total new tokens over total wall time) over the baseline's at the
same temperature and batch size, both over the prompts the two ran. Mean
accepted tokens is new tokens per target call, the prefill call included, so
plain decoding scores 1.00 (Spec-Bench's convention, as in summary.md).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

from specjax.analysis import leviathan
from specjax.experiments.config import BASELINE
from specjax.reports.rows import Row, Setting


@dataclasses.dataclass(frozen=True)
class Figures:
  """One setting's figures; the speculative ones are None for the baseline."""

  setting: Setting
  prompts: int
  tokens_per_s: float | None
  speedup: float | None
  acceptance_rate: float | None = None          # accepted / drafted drafts
  mean_accepted_tokens: float | None = None     # new tokens per target call
  alpha: float | None = None                    # Leviathan's (chains), from drafts per call
  by_position: tuple[float, ...] | None = None  # acceptances of position i per verify call

  @property
  def method(self) -> str:
    return self.setting[0]

  @property
  def gamma(self) -> int:
    return self.setting[1]


def sort_key(setting: Setting):
  """The baseline first, then methods by name, chains before trees, gamma, temperature and
  batch size."""
  return setting.method != BASELINE, setting.method, setting.tree, *setting[1:4]


def group(rows: Sequence[Row]) -> dict[Setting, list[Row]]:
  groups = collections.defaultdict(list)
  for row in rows:
    groups[row.setting].append(row)
  return {s: groups[s] for s in sorted(groups, key=sort_key)}


def tokens_per_s(rows: Sequence[Row]) -> float | None:
  wall_s = sum(r.wall_s for r in rows)
  return sum(r.new_tokens for r in rows) / wall_s if wall_s > 0 else None


def speedup(rows: Sequence[Row], baseline: Sequence[Row]) -> float | None:
  """Tokens/s over the baseline's, both over the prompts both ran."""
  shared = {r.prompt_id for r in rows} & {r.prompt_id for r in baseline}
  mine = tokens_per_s([r for r in rows if r.prompt_id in shared])
  theirs = tokens_per_s([r for r in baseline if r.prompt_id in shared])
  return mine / theirs if mine and theirs else None


def figures(rows: Sequence[Row]) -> list[Figures]:
  groups = group(rows)
  out = []
  for setting, members in groups.items():
    baseline = groups.get(Setting(BASELINE, 0, setting.temperature, setting.batch_size), [])
    fig = Figures(setting, len(members), tokens_per_s(members), speedup(members, baseline))
    if setting.method != BASELINE:
      fig = dataclasses.replace(fig, **_speculative(members, setting))
    out.append(fig)
  return out


def alpha(rows: Sequence[Row], setting: Setting) -> float | None:
  """Leviathan's alpha from the rows' accepted drafts per verify call. It models a chain
  of i.i.d. acceptances, so a tree has none."""
  verify_calls = sum(r.verify_calls for r in rows)
  if not verify_calls or setting.tree:
    return None
  return leviathan.alpha_from_counts(sum(r.accepted_tokens for r in rows), verify_calls,
                                     setting.gamma)


def _speculative(rows: Sequence[Row], setting: Setting) -> dict:
  drafted = sum(r.drafted_tokens for r in rows)
  accepted = sum(r.accepted_tokens for r in rows)
  calls = sum(r.target_calls for r in rows)
  verify_calls = sum(r.verify_calls for r in rows)
  out = dict(acceptance_rate=accepted / drafted if drafted else None,
             mean_accepted_tokens=sum(r.new_tokens for r in rows) / calls,
             alpha=alpha(rows, setting))
  if verify_calls and all(r.acceptance_by_position is not None for r in rows):
    out['by_position'] = tuple(sum(column) / verify_calls
                               for column in zip(*(r.acceptance_by_position for r in rows)))
  return out


def accepted_per_task(rows: Sequence[Row]) -> dict[str, dict[Setting, float]]:
  """Mean accepted tokens of each speculative setting in each category, and over 'all'."""
  speculative = [r for r in rows if r.method != BASELINE]
  out = {}
  for category in sorted({r.category for r in speculative}) + ['all']:
    members = [r for r in speculative if category in ('all', r.category)]
    out[category] = {s: sum(r.new_tokens for r in rs) / sum(r.target_calls for r in rs)
                     for s, rs in group(members).items()}
  return out


@dataclasses.dataclass(frozen=True)
class Prediction:
  setting: Setting
  alpha: float
  cost_ratio: float
  predicted: float
  measured: float | None


def predictions(figs: Sequence[Figures], cost_ratios: Mapping[str, float]) -> list[Prediction]:
  """Leviathan et al.'s walltime improvement from each setting's alpha and gamma and its
  method's draft cost in target calls; settings whose method has no cost are left out."""
  return [Prediction(f.setting, f.alpha, cost_ratios[f.method],
                     leviathan.walltime_improvement(f.alpha, f.gamma, cost_ratios[f.method]),
                     f.speedup)
          for f in figs if f.method in cost_ratios and f.alpha is not None]


def speedup_by_batch_size(figs: Sequence[Figures]) -> dict[Setting, dict[int, float]]:
  """A speculative setting (its batch size 0) -> batch size -> speedup."""
  out = collections.defaultdict(dict)
  for f in figs:
    if f.method != BASELINE and f.speedup is not None:
      out[f.setting._replace(batch_size=0)][f.setting.batch_size] = f.speedup
  return dict(out)
