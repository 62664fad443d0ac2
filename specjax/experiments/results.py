"""The results directory: rows appended as they are made, so a run can resume.

`results.jsonl` gets one row per prompt and method, flushed as soon as it
exists; a restart with the same config skips every row already there (keyed
by prompt id, method and the method's config fingerprint). `config.json`
records the settings the rows were made under, and a run whose shared
settings differ is refused rather than mixed in.

Nothing here loses rows. The directory is locked for the whole run
(`lock.DirectoryLock`). `config.json` and the summaries are replaced
atomically (a temporary file, then a rename), and `config.json` only when the
run's first row is written, so a run that fails before then leaves the
directory as it found it. With `resume=False` the old rows go the same way:
`results.jsonl` and the summaries are renamed `*.previous.*` at the first new
row, not at the start.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from absl import logging

from specjax.experiments import lock as lock_lib
from specjax.experiments.config import BASELINE, SHARED_KEYS, ConfigError, ExperimentConfig

RESULTS = 'results.jsonl'
CONFIG = 'config.json'
SUMMARY_JSON = 'summary.json'
SUMMARY_MD = 'summary.md'
_REPLACED_BY_A_FRESH_RUN = (RESULTS, SUMMARY_JSON, SUMMARY_MD)


def row_key(row: dict[str, Any]) -> tuple[str, str, str]:
  return row['prompt_id'], row['method'], row['fingerprint']


def previous_name(name: str) -> str:
  """'results.jsonl' -> 'results.previous.jsonl': where resume=False moves the old file."""
  stem, dot, suffix = name.rpartition('.')
  return f'{stem}.previous.{suffix}' if dot else f'{name}.previous'


class ResultsDir:
  """Reads the rows already written and appends new ones, holding the directory's lock.

  `checkpoints` maps 'model' (and 'draft_model') to the content digest of the
  checkpoint named, so a different file at the same path is a different config.
  """

  def __init__(self, config: ExperimentConfig, checkpoints: Mapping[str, str]):
    self.dir = config.output_dir
    self.path = os.path.join(self.dir, RESULTS)
    try:
      os.makedirs(self.dir, exist_ok=True)
    except OSError as e:
      raise ConfigError(f'config.output_dir {self.dir!r} cannot be created: '
                        f'{e.strerror or e}') from None
    try:
      self._lock = lock_lib.DirectoryLock(self.dir, ConfigError)
    except PermissionError as e:
      raise ConfigError(f'config.output_dir {self.dir!r} is not writable: {e.strerror}') from None
    try:
      self._open(config, checkpoints)
    except BaseException:
      self._lock.release()
      raise

  def _open(self, config: ExperimentConfig, checkpoints: Mapping[str, str]) -> None:
    self._record = {'fingerprint': config.fingerprint(BASELINE, checkpoints),
                    'config': config.to_dict(), 'checkpoint_sha256': dict(checkpoints)}
    previous = self._read_config()
    if config.resume and previous and previous.get('fingerprint') != self._record['fingerprint']:
      raise ConfigError(
          f'config.output_dir {self.dir!r} holds results made under a different config '
          f'(changed: {", ".join(_changed(config, checkpoints, previous))}); pick another '
          'output_dir, or set --config.resume=False to set them aside')
    self.rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    self._set_aside = not config.resume
    self._started = False
    if config.resume:
      self._read()

  def _read_config(self) -> dict[str, Any] | None:
    """config.json, or None when there is none or it cannot be read (rows are keyed anyway)."""
    path = os.path.join(self.dir, CONFIG)
    try:
      with open(path, encoding='utf-8') as f:
        previous = json.load(f)
      if isinstance(previous, dict):
        return previous
      raise ValueError('not a JSON object')
    except FileNotFoundError:
      return None
    except (OSError, ValueError) as e:
      logging.warning('%s is unreadable (%s); it is rewritten with this run\'s first row. Rows '
                      'are still matched by their own fingerprints.', path, e)
      return None

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
      write_text(self.dir, RESULTS, ''.join(kept))

  def get(self, prompt_id: str, method: str, fingerprint: str) -> dict[str, Any] | None:
    return self.rows.get((prompt_id, method, fingerprint))

  def append(self, row: dict[str, Any]) -> None:
    """Appends one row with a single write(2), so an interrupt never leaves half of it."""
    if not self._started:
      self._start()
    data = (json.dumps(row, ensure_ascii=False) + '\n').encode('utf-8')
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      os.write(fd, data)
      os.fsync(fd)
    finally:
      os.close(fd)
    self.rows[row_key(row)] = row

  def finish(self) -> None:
    """Records this run's config even when every row was already there."""
    if not self._started:
      self._start()

  def _start(self) -> None:
    """The first write of this run: set old rows aside (resume=False), then record the config."""
    if self._set_aside:
      for name in _REPLACED_BY_A_FRESH_RUN:
        path = os.path.join(self.dir, name)
        if os.path.exists(path):
          os.replace(path, os.path.join(self.dir, previous_name(name)))
          logging.info('resume=False: moved %s to %s', name, previous_name(name))
    write_text(self.dir, CONFIG, json.dumps(self._record, indent=2) + '\n')
    self._started = True

  def release(self) -> None:
    self._lock.release()

  def __enter__(self) -> ResultsDir:
    return self

  def __exit__(self, *exc) -> None:
    self.release()


def write_text(directory: str, name: str, text: str) -> str:
  """Writes `directory/name` atomically: a reader sees the old file or the new, never half."""
  path = os.path.join(directory, name)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{name}.', suffix='.tmp')
  try:
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise
  return path


def _changed(config: ExperimentConfig, checkpoints: Mapping[str, str],
             previous: dict[str, Any]) -> list[str]:
  old = previous.get('config', {})
  changed = [k for k in SHARED_KEYS if _jsonable(getattr(config, k)) != old.get(k)]
  old_digests = previous.get('checkpoint_sha256')
  for key, digest in checkpoints.items():
    if key in changed:
      continue
    if old_digests is None:
      changed.append(f'{key} contents, which the run that made these rows did not record')
    elif old_digests.get(key) != digest:
      changed.append(f'the contents of {key}')
  return changed or ['unknown']


def _jsonable(value):
  return list(value) if isinstance(value, tuple) else value
