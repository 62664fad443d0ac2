"""The results directory: rows appended as they are made, so a run can resume.

`results.jsonl` gets one row per prompt and method, flushed as soon as it
exists; a restart with the same config skips every row already there (keyed
by prompt id, method and the method's config fingerprint). `config.json`
records the settings the rows were made under, and a run whose shared
settings differ is refused rather than mixed in.
"""

from __future__ import annotations

import json
import os
from typing import Any

from absl import logging

from specjax.experiments.config import BASELINE, SHARED_KEYS, ConfigError, ExperimentConfig

RESULTS = 'results.jsonl'
CONFIG = 'config.json'
SUMMARY_JSON = 'summary.json'
SUMMARY_MD = 'summary.md'


def row_key(row: dict[str, Any]) -> tuple[str, str, str]:
  return row['prompt_id'], row['method'], row['fingerprint']


class ResultsDir:
  """Reads the rows already written and appends new ones."""

  def __init__(self, config: ExperimentConfig):
    self.dir = config.output_dir
    self.path = os.path.join(self.dir, RESULTS)
    os.makedirs(self.dir, exist_ok=True)
    config_path = os.path.join(self.dir, CONFIG)
    shared = config.fingerprint(BASELINE)
    if config.resume and os.path.exists(config_path):
      with open(config_path, encoding='utf-8') as f:
        previous = json.load(f)
      if previous.get('fingerprint') != shared:
        old = previous.get('config', {})
        changed = [k for k in SHARED_KEYS if _jsonable(getattr(config, k)) != old.get(k)]
        raise ConfigError(
            f'{self.dir} holds results made under a different config (changed: '
            f'{", ".join(changed)}); pick another output_dir, or set --config.resume=False '
            'to discard them')
    self.rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    if config.resume:
      self._read()
    else:
      open(self.path, 'w', encoding='utf-8').close()
    # Through a temporary file: a run killed here must not leave an empty config.json
    # that the restart cannot read.
    tmp = f'{config_path}.{os.getpid()}.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump({'fingerprint': shared, 'config': config.to_dict()}, f, indent=2)
    os.replace(tmp, config_path)

  def _read(self) -> None:
    if not os.path.exists(self.path):
      return
    with open(self.path, encoding='utf-8') as f:
      lines = f.read().splitlines(keepends=True)
    kept = []
    for number, line in enumerate(lines, start=1):
      try:
        row = json.loads(line)
      except json.JSONDecodeError:
        if number == len(lines):  # A run killed mid-write leaves half a line.
          logging.warning('%s:%d: dropping an incomplete last row', self.path, number)
          break
        raise ConfigError(f'{self.path}:{number}: not valid JSON; fix or delete the file') from None
      kept.append(line if line.endswith('\n') else line + '\n')
      self.rows.setdefault(row_key(row), row)
    if kept != lines:
      with open(self.path, 'w', encoding='utf-8') as f:
        f.writelines(kept)

  def get(self, prompt_id: str, method: str, fingerprint: str) -> dict[str, Any] | None:
    return self.rows.get((prompt_id, method, fingerprint))

  def append(self, row: dict[str, Any]) -> None:
    with open(self.path, 'a', encoding='utf-8') as f:
      f.write(json.dumps(row, ensure_ascii=False) + '\n')
      f.flush()
      os.fsync(f.fileno())
    self.rows[row_key(row)] = row



def write_text(directory: str, name: str, text: str) -> str:
  path = os.path.join(directory, name)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)
  return path


def _jsonable(value):
  return list(value) if isinstance(value, tuple) else value
