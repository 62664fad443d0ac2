"""A sweep's cells: a config file's `get_sweep()` checked and applied to its base config.

A cell is a dict of config overrides. Keys may be nested dicts or dotted paths
('ngram.max_n' and {'ngram': {'max_n': 3}} set the same key), so drafter
settings can live in sub-dicts. Every cell is checked before the first one
runs: an unknown key, drafter or category fails the whole sweep at once, not
after an hour of other cells.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import json
from collections.abc import Mapping, Sequence
from typing import Any

from specjax.experiments import prompts as prompts_lib
from specjax.experiments.config import ConfigError, ExperimentConfig

# The sweep decides where each cell's rows go, so a cell may not.
RESERVED_KEYS = ('output_dir', 'resume')


@dataclasses.dataclass(frozen=True)
class Cell:
  id: str                     # a hash of the overrides: the resume key in cells.jsonl
  label: str                  # the overrides as 'key=value,...', for people
  overrides: dict[str, Any]   # dotted key -> value, JSON-ready (tuples as lists)
  config: dict[str, Any]      # the base config with the overrides applied
  experiment: ExperimentConfig


def flatten(overrides: Mapping[str, Any], base: Mapping[str, Any], where: str) -> dict[str, Any]:
  """{'a': {'b': 1}} and {'a.b': 1} -> {'a.b': 1}; every path must exist in `base`.

  A dict value is descended into only where the base holds a dict too, so a
  key whose value is a dict can still be replaced whole.
  """
  flat = {}
  for key, value in overrides.items():
    if not isinstance(key, str) or not key:
      raise ConfigError(f'{where}: config keys are non-empty strings, got {key!r}')
    node, parts = base, key.split('.')
    for depth, part in enumerate(parts):
      if not isinstance(node, Mapping) or part not in node:
        known = ', '.join(sorted(node)) if isinstance(node, Mapping) else '(not a dict)'
        raise ConfigError(f'{where}: unknown config key {".".join(parts[:depth + 1])!r}; '
                          f'known there: {known}')
      node = node[part]
    if isinstance(value, Mapping) and isinstance(node, Mapping):
      flat.update(flatten({f'{key}.{k}': v for k, v in value.items()}, base, where))
    else:
      flat[key] = value
  return flat


def apply(base: Mapping[str, Any], flat: Mapping[str, Any]) -> dict[str, Any]:
  """A deep copy of `base` with each dotted key of `flat` set."""
  config = copy.deepcopy(dict(base))
  for key, value in flat.items():
    *parents, leaf = key.split('.')
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = value
  return config


def expand(base: Mapping[str, Any], sweep: Sequence[Mapping[str, Any]]) -> list[Cell]:
  """The checked cells of `sweep` on `base` (a plain dict of every config key)."""
  if isinstance(sweep, Mapping) or not isinstance(sweep, Sequence) or not sweep:
    raise ConfigError('get_sweep() must return a non-empty list of dicts of config overrides, '
                      f'got {type(sweep).__name__} {sweep!r:.80}')
  cells, seen, prompt_sets = [], {}, {}
  for number, overrides in enumerate(sweep, start=1):
    where = f'sweep cell {number}'
    if not isinstance(overrides, Mapping):
      raise ConfigError(f'{where}: expected a dict of config overrides, got {overrides!r:.80}')
    flat = {k: _jsonable(v) for k, v in flatten(overrides, base, where).items()}
    reserved = [k for k in flat if k.split('.')[0] in RESERVED_KEYS]
    if reserved:
      raise ConfigError(f'{where}: sets {", ".join(reserved)}, which the sweep owns (set '
                        'output_dir on the base config instead)')
    label = ','.join(f'{k}={_show(v)}' for k, v in flat.items()) or '(base config)'
    where = f'{where} ({label})'
    config = apply(base, flat)
    try:
      experiment = ExperimentConfig.from_config(config)
      if experiment.prompts not in prompt_sets:
        prompt_sets[experiment.prompts] = prompts_lib.load_prompts(experiment.prompts)
      prompts_lib.select(prompt_sets[experiment.prompts], experiment.categories, experiment.limit,
                        experiment.per_category)
    except ConfigError as e:
      raise ConfigError(f'{where}: {e}') from None
    cell_id = hashlib.sha256(json.dumps(flat, sort_keys=True).encode()).hexdigest()[:12]
    if cell_id in seen:
      raise ConfigError(f'{where}: the same overrides as sweep cell {seen[cell_id]}')
    seen[cell_id] = number
    cells.append(Cell(cell_id, label, flat, config, experiment))
  return cells


def _jsonable(value: Any) -> Any:
  if isinstance(value, (tuple, list)):
    return [_jsonable(v) for v in value]
  if isinstance(value, Mapping):
    return {k: _jsonable(v) for k, v in value.items()}
  return value


def _show(value: Any) -> str:
  """A value as the config arg spells it: tuples '+'-joined."""
  if isinstance(value, list):
    return '+'.join(map(str, value)) if value else '()'
  return str(value)


def from_config_file(filename: str) -> list[Mapping[str, Any]]:
  """`get_sweep(arg)` of a config file named as --config names it ('path.py:arg')."""
  path, _, arg = filename.partition(':')
  spec = importlib.util.spec_from_file_location('sweep_config', path)
  if spec is None or spec.loader is None:
    raise ConfigError(f'{path}: not a Python config file')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, 'get_sweep'):
    raise ConfigError(f'{path} defines no get_sweep(); a sweep needs one')
  try:
    return module.get_sweep(arg or None)
  except ValueError as e:  # a bad arg, as get_config reports it
    raise ConfigError(f'{path}: get_sweep({arg!r}): {e}') from None
