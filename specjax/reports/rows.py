"""Result rows read from every `*.jsonl` in a directory, checked once, at the edge.

A report needs only the rows: `results.jsonl` from `run_experiment`, and any
other JSONL of rows beside it (a sweep's, a copy from another machine). Each
line becomes a frozen `Row`; a line that is not a row is an error naming its
file and line, since a silently dropped row would change every figure.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Any, NamedTuple

from specjax.experiments.config import BASELINE


class ReportError(ValueError):
  """Input a report cannot be made from; the message names the file and line."""


class Setting(NamedTuple):
  """A method as run: the drafts per call (0 for the baseline; a tree's depth), the
  sampling temperature, the batch size, and the token tree ('' for chains)."""

  method: str
  gamma: int
  temperature: float
  batch_size: int
  tree: str = ''

  @property
  def shape(self) -> str:
    """'4' for a chain of 4 drafts, 'tree 25/5' for a tree of 25 nodes 5 deep."""
    if not self.tree:
      return str(self.gamma)
    return f'tree {self.tree.count(",") + 1}/{self.gamma}'


@dataclasses.dataclass(frozen=True)
class Row:
  """One prompt's run by one method; the speculative counters are None for the baseline."""

  where: str                  # 'dir/file.jsonl:12', for messages
  prompt_id: str
  category: str
  method: str
  temperature: float
  batch_size: int
  new_tokens: int
  wall_s: float
  fingerprint: str | None
  gamma: int | None = None               # drafts per call; a tree's depth
  target_calls: int | None = None       # the prefill included
  plain_calls: int = 0                  # calls that verified no draft (0 in rows before December 2026)
  tree: str = ''                        # a token tree's parent indices; '' for chains
  accepted_tokens: int | None = None
  drafted_tokens: int | None = None
  acceptance_by_position: tuple[int, ...] | None = None
  top_k: int | None = None              # recorded since December 2026; None in older rows
  top_p: float | None = None

  @property
  def setting(self) -> Setting:
    """What a row's figures are grouped by."""
    return Setting(self.method, self.gamma or 0, self.temperature, self.batch_size, self.tree)

  @property
  def verify_calls(self) -> int:
    """Target calls that verified drafts: neither the prefill nor a plain decoding step."""
    return self.target_calls - 1 - self.plain_calls



_TEXT = ('prompt_id', 'category', 'method')
_COUNTS = ('new_tokens',)
_SPECULATIVE = ('gamma', 'target_calls', 'accepted_tokens', 'drafted_tokens')


def read_rows(directory: str) -> list[Row]:
  """Every row of every `*.jsonl` in `directory` (not its subfolders), in file order.

  The same row in two files (equal fingerprints, or equal rows) counts once;
  two different rows for one prompt and setting are an error, since which
  one a figure should use is the reader's call. In a sweep's cells.jsonl, cells
  whose overrides tell such rows apart (one drafter with two checkpoints) are
  methods of their own, named by those overrides: 'eagle [eagle.checkpoint=...]'.
  """
  if not os.path.isdir(directory):
    raise ReportError(f'{directory}: no such directory')
  paths = sorted(glob.glob(os.path.join(directory, '*.jsonl')))
  if not paths:
    raise ReportError(f'{directory}: no *.jsonl result files (run_experiment writes results.jsonl)')
  rows, seen = [], {}
  for path in paths:
    for row, raw in _read_file(path):
      key = _key(row)
      if key in seen:
        first, first_raw = seen[key]
        if _same(row, raw, first, first_raw):
          continue
        raise ReportError(
            f'{first.where} and {row.where} are both prompt {row.prompt_id!r}, method '
            f'{row.method!r}, gamma {row.setting.shape}, temperature {row.temperature}, batch size '
            f'{row.batch_size}, but differ (fingerprints {first.fingerprint} and '
            f'{row.fingerprint}); keep one of them in {directory}')
      seen[key] = row, raw
      rows.append(row)
  if not rows:
    raise ReportError(f'{directory}: the *.jsonl files hold no rows')
  return rows


def _key(row: Row) -> tuple:
  """What two rows of one figure may not both have: the prompt and the setting."""
  return (row.prompt_id, *row.setting)


def _same(row: Row, raw: dict, other: Row, other_raw: dict) -> bool:
  """Whether two rows with one key are one row read twice (equal, or equal fingerprints)."""
  return raw == other_raw or bool(row.fingerprint and row.fingerprint == other.fingerprint)


SWEEP_CELLS = 'cells.jsonl'   # a sweep's records: each 'ok' line carries its cell's rows
_ABSENT = object()            # an override a cell does not set


def _read_file(path: str):
  """(Row, raw) pairs of a rows file, or of the rows inside a sweep's cell records."""
  if os.path.basename(path) != SWEEP_CELLS:
    for raw, where in _lines(path):
      yield _row(raw, where), raw
    return
  cells = []   # (overrides, [(Row, raw)]) of each ok cell
  for record, where in _lines(path):
    if record.get('status') != 'ok':
      continue
    rows = record.get('rows')
    if not isinstance(rows, list):
      raise ReportError(f'{where}: a sweep cell record without a list of rows')
    for i, raw in enumerate(rows):
      if not isinstance(raw, dict):
        raise ReportError(f'{where}: row {i} of the cell is not a JSON object')
    overrides = record.get('overrides')
    cells.append((overrides if isinstance(overrides, dict) else {},
                  [(_row(raw, f'{where} row {i}'), raw) for i, raw in enumerate(rows)]))
  labels = _distinguishing_overrides(cells)
  for overrides, rows in cells:
    suffix = ', '.join(f'{key}={overrides[key]}' for key in labels if key in overrides)
    for row, raw in rows:
      if suffix and row.method != BASELINE:
        row = dataclasses.replace(row, method=f'{row.method} [{suffix}]')
      yield row, raw


def _distinguishing_overrides(cells) -> list[str]:
  """The override keys that tell apart two of a sweep's cells whose rows would otherwise be
  the same method, prompt and setting but differ (e.g. two `eagle.checkpoint` values): a
  report names those cells' methods with them. Keys that only select prompts or set what
  the setting already holds never collide, so they name nothing."""
  first = {}   # (prompt, setting) -> (cell index, row, raw)
  keys = set()
  for index, (overrides, rows) in enumerate(cells):
    for row, raw in rows:
      if row.method == BASELINE:
        continue
      key = _key(row)
      if key not in first:
        first[key] = index, row, raw
        continue
      other_index, other, other_raw = first[key]
      if other_index == index or _same(row, raw, other, other_raw):
        continue
      other_overrides = cells[other_index][0]
      keys |= {k for k in set(overrides) | set(other_overrides)
               if overrides.get(k, _ABSENT) != other_overrides.get(k, _ABSENT)}
  return sorted(keys)


def _lines(path: str):
  with open(path, encoding='utf-8') as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f'{path}:{number}'
      try:
        raw = json.loads(line)
      except json.JSONDecodeError as e:
        raise ReportError(f'{where}: not valid JSON ({e.msg})') from None
      if not isinstance(raw, dict):
        raise ReportError(f'{where}: a row must be a JSON object')
      yield raw, where


def _row(raw: dict[str, Any], where: str) -> Row:
  def need(key, kind, minimum=None):
    if key not in raw or raw[key] is None:
      raise ReportError(f'{where}: the row has no {key!r}')
    value = raw[key]
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok or (minimum is not None and value < minimum):
      wanted = {str: 'a string', int: 'an integer'}.get(kind, 'a number')
      bound = f' >= {minimum}' if minimum is not None else ''
      raise ReportError(f'{where}: {key!r} must be {wanted}{bound}, got {value!r}')
    return value

  for key in _TEXT:
    need(key, str)
  fields = dict(
      where=where, prompt_id=raw['prompt_id'], category=raw['category'], method=raw['method'],
      temperature=float(need('temperature', (int, float), 0)),
      batch_size=need('batch_size', int, 1) if 'batch_size' in raw else 1,
      new_tokens=need('new_tokens', int, 0), wall_s=float(need('wall_s', (int, float), 0)),
      fingerprint=raw.get('fingerprint'))
  if raw.get('top_k') is not None:
    fields['top_k'] = need('top_k', int, 0)
  if raw.get('top_p') is not None:
    fields['top_p'] = float(need('top_p', (int, float), 0))
  if raw['method'] == BASELINE:
    return Row(**fields)
  fields.update(gamma=need('gamma', int, 1), target_calls=need('target_calls', int, 1),
                accepted_tokens=need('accepted_tokens', int, 0),
                drafted_tokens=need('drafted_tokens', int, 0))
  if raw.get('plain_calls') is not None:
    fields['plain_calls'] = need('plain_calls', int, 0)
    if fields['plain_calls'] > fields['target_calls'] - 1:
      raise ReportError(f'{where}: {fields["plain_calls"]} plain calls, but only '
                        f'{fields["target_calls"] - 1} calls after the prefill')
  if raw.get('tree'):
    tree = need('tree', str)
    parents = [p.strip() for p in tree.split(',')]
    if (not all(p.lstrip('-').isdigit() for p in parents)
        or len(parents) < fields['gamma']):
      raise ReportError(f'{where}: tree must be the parent indices of at least gamma '
                        f'({fields["gamma"]}) nodes, got {tree!r}')
    fields['tree'] = ','.join(parents)
  verify_calls = fields['target_calls'] - 1 - fields.get('plain_calls', 0)
  if fields['accepted_tokens'] > fields['gamma'] * verify_calls:
    raise ReportError(f'{where}: {fields["accepted_tokens"]} accepted drafts in '
                      f'{verify_calls} verify calls of gamma {fields["gamma"]}')
  by_position = raw.get('acceptance_by_position')
  if by_position is not None:
    if (not isinstance(by_position, list) or len(by_position) != fields['gamma']
        or not all(isinstance(n, int) and n >= 0 for n in by_position)):
      raise ReportError(f'{where}: acceptance_by_position must be gamma '
                        f'({fields["gamma"]}) counts, got {by_position!r}')
    fields['acceptance_by_position'] = tuple(by_position)
  return Row(**fields)
