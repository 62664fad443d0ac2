"""A sweep's directory: which config it belongs to, and one record per finished cell.

`sweep_config.json` holds the base config the sweep was started with; a later
sweep into the same directory with another base config is refused before it
runs, so records made under different settings are never mixed and never
overwritten. `cells.jsonl` gets one line per finished cell, written in one
call and synced as soon as the cell ends: its figures, its rows, its status
('ok' or 'error' with the error) and where and when it ran (device kind, jax
version, git commit, date). A restart skips every cell with an 'ok' line; a
failed cell is tried again and gets a new line. Each cell's own rows are kept,
as a plain run's are, in `runs/<settings hash>/results.jsonl`, so a cell killed
half-way resumes from its last row.
"""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
import subprocess
from typing import Any

from absl import logging
import jax

from specjax.experiments.config import ConfigError

CONFIG = 'sweep_config.json'
CELLS = 'cells.jsonl'
TABLE = 'sweep.md'
RUNS = 'runs'
# Keys that do not change what a cell computes, so they may differ on a restart.
_IGNORED_KEYS = ('output_dir', 'resume')


class SweepDir:
  """Checks the directory belongs to this sweep, reads its records and appends new ones."""

  def __init__(self, directory: str | os.PathLike, base: dict[str, Any]):
    self.dir = Path(directory)
    self.path = self.dir / CELLS
    settings = {k: v for k, v in base.items() if k not in _IGNORED_KEYS}
    config_path = self.dir / CONFIG
    if config_path.exists():
      try:
        previous = json.loads(config_path.read_text(encoding='utf-8'))['base']
      except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f'{config_path}: unreadable ({e}); fix or delete it') from None
      if previous != _jsonable(settings):
        changed = sorted(k for k in set(previous) | set(settings)
                         if previous.get(k) != _jsonable(settings.get(k)))
        raise ConfigError(
            f'{self.dir} holds a sweep made under a different config (changed: '
            f'{", ".join(changed)}); its results are never overwritten: pick another '
            'output_dir')
    elif self.path.exists():
      raise ConfigError(f'{self.path} exists without {CONFIG}; pick another output_dir')
    else:
      self.dir.mkdir(parents=True, exist_ok=True)
      _write_atomically(config_path, json.dumps({'base': _jsonable(settings)}, indent=2) + '\n')
    self.records = self._read()

  def run_dir(self, settings_hash: str) -> str:
    return str(self.dir / RUNS / settings_hash)

  def finished(self) -> dict[str, dict[str, Any]]:
    """cell id -> its 'ok' record."""
    return {r['cell']: r for r in self.records if r.get('status') == 'ok'}

  def latest(self) -> dict[str, dict[str, Any]]:
    """cell id -> its last record, ok or not."""
    return {r['cell']: r for r in self.records}

  def append(self, record: dict[str, Any]) -> None:
    """One line, one write, synced: a kill leaves the cell whole or absent."""
    data = (json.dumps(record, ensure_ascii=False) + '\n').encode('utf-8')
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      written = os.write(fd, data)
      if written != len(data):
        raise OSError(f'{self.path}: short write ({written} of {len(data)} bytes)')
      os.fsync(fd)
    finally:
      os.close(fd)
    self.records.append(record)

  def _read(self) -> list[dict[str, Any]]:
    if not self.path.exists():
      return []
    lines = self.path.read_text(encoding='utf-8').splitlines(keepends=True)
    records = []
    for number, line in enumerate(lines, start=1):
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        if number == len(lines):  # killed mid-write: that cell never finished
          logging.warning('%s:%d: dropping an incomplete last record', self.path, number)
          _write_atomically(self.path, ''.join(lines[:-1]))
          break
        raise ConfigError(f'{self.path}:{number}: not valid JSON; fix or delete the file') from None
      if not line.endswith('\n'):  # whole JSON, but the newline was cut off
        _write_atomically(self.path, ''.join(lines) + '\n')
    return records


def provenance() -> dict[str, Any]:
  """Where and with what a cell ran, recorded with it (the date is added per record)."""
  device = jax.devices()[0]
  commit, dirty = _git_state()
  return dict(device_kind=device.device_kind, platform=device.platform,
              device_count=jax.device_count(), jax_version=jax.__version__,
              git_commit=commit, git_dirty=dirty)


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')


def _git_state() -> tuple[str | None, bool | None]:
  """(HEAD commit, uncommitted changes?) of the specjax checkout; (None, None) without git."""
  source = Path(__file__).resolve().parent
  try:
    commit = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=source, capture_output=True,
                            text=True, timeout=10, check=True).stdout.strip()
    status = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'],
                            cwd=source, capture_output=True, text=True, timeout=10, check=True)
  except (OSError, subprocess.SubprocessError):  # no git, not a checkout (an installed wheel)
    return None, None
  return commit or None, bool(status.stdout.strip())


def _write_atomically(path: Path, text: str) -> None:
  tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
  tmp.write_text(text, encoding='utf-8')
  os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
  return json.loads(json.dumps(value))  # tuples -> lists, as they come back from the file
