"""Sweeps on the random tiny model: cells recorded once each, kills survived, failures kept.

A sweep is a list of config-override dicts; every cell is checked before any
runs, each finished cell is one line of cells.jsonl, and a restart skips what
is there. The kill test runs `python -m specjax.sweep` in a subprocess and
SIGKILLs it after its first cell is written.
"""

import collections
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import pytest

from specjax import experiment
from specjax.experiments import methods
from specjax.experiments import sweep_cells
from specjax.experiments import sweep_runner
from specjax.experiments.config import ConfigError

from cache_dirs import fresh_cache_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]
GEMMA_CONFIG = ROOT / 'configs' / 'gemma.py'


def write_lines(path, lines):
  path.write_text(''.join(line + '\n' for line in lines), encoding='utf-8')
  return str(path)


def tiny_config(tmp_path, **overrides):
  """configs/gemma.py on the tiny model: three short prompts, 6 tokens, the ngram drafter."""
  tmp_path.mkdir(parents=True, exist_ok=True)
  path = write_lines(tmp_path / 'prompts.jsonl', [
      json.dumps({'id': 'p1', 'category': 'alpha', 'prompt': 'abc abc abc abc'}),
      json.dumps({'id': 'p2', 'category': 'beta', 'prompt': 'hello hello'}),
      json.dumps({'id': 'p3', 'category': 'alpha', 'prompt': 'xyz'}),
  ])
  spec = importlib.util.spec_from_file_location('gemma_config', GEMMA_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.update(dict(model='tiny-random', prompts=path, max_new_tokens=6, drafters=('ngram',),
                     gamma=3, output_dir=str(tmp_path / 'out')))
  config.update(overrides)
  return config


def read_cells(directory):
  path = pathlib.Path(directory) / 'cells.jsonl'
  return [json.loads(line) for line in path.read_text(encoding='utf-8').splitlines()]


# ---------------------------------------------------------------- cells


def test_nested_and_dotted_overrides_set_the_same_key():
  base = {'gamma': 4, 'ngram': {'max_n': 3, 'min_n': 1}, 'draft': {'path': ''}}
  dotted = sweep_cells.flatten({'ngram.max_n': 5, 'gamma': 2}, base, 'cell')
  nested = sweep_cells.flatten({'ngram': {'max_n': 5}, 'gamma': 2}, base, 'cell')
  assert dotted == nested == {'ngram.max_n': 5, 'gamma': 2}
  applied = sweep_cells.apply(base, dotted)
  assert applied == {'gamma': 2, 'ngram': {'max_n': 5, 'min_n': 1}, 'draft': {'path': ''}}
  assert base['ngram']['max_n'] == 3  # the base is not modified
  with pytest.raises(ConfigError, match="'ngram.max'"):
    sweep_cells.flatten({'ngram': {'max': 5}}, base, 'cell')
  with pytest.raises(ConfigError, match="'gamma.x'"):
    sweep_cells.flatten({'gamma.x': 5}, base, 'cell')


def test_gemma_sweep_cells_are_valid_and_distinct(tmp_path):
  config = tiny_config(tmp_path, prompts='')  # the built-in prompts
  sweep = sweep_cells.from_config_file(f'{GEMMA_CONFIG}:quick')
  cells = sweep_cells.expand(config.to_dict(), sweep)
  assert len(cells) == len({c.id for c in cells}) == 4   # n-gram at gamma 2, 4, 6, 8
  assert {tuple(c.overrides) for c in cells} == {
      ('drafters', 'gamma', 'temperature', 'categories', 'batch_size')}
  assert cells[0].label == 'drafters=ngram,gamma=2,temperature=0.0,categories=(),batch_size=1'


@pytest.mark.parametrize('sweep, message', [
    ([dict(drafters=('hydra',))], "unknown drafter 'hydra'"),
    ([dict(gamma=2), dict(gama=3)], "sweep cell 2: unknown config key 'gama'"),
    ([dict(ngram={'max_m': 3})], "unknown config key 'ngram.max_m'; known there: max_n, min_n"),
    ([dict(gamma=0)], 'config.gamma is 0: must be >= 1'),
    ([dict(categories=('poetry',))], 'poetry'),
    ([dict(output_dir='/tmp/elsewhere')], 'output_dir'),
    ([dict(gamma=2), dict(gamma=2)], 'same overrides as sweep cell 1'),
    ([], 'non-empty list'),
    (dict(gamma=2), 'non-empty list'),
    (['gamma=2'], 'dict of config overrides'),
])
def test_a_bad_sweep_fails_before_anything_runs(tmp_path, sweep, message):
  config = tiny_config(tmp_path)
  with pytest.raises(ConfigError, match=message):
    sweep_runner.run_sweep(config, sweep)
  assert not pathlib.Path(config.output_dir).exists()


def test_a_sweep_file_with_an_unknown_drafter_fails_plainly(tmp_path):
  config_file = tmp_path / 'bad_sweep.py'
  config_file.write_text(
      'import importlib.util\n'
      f'spec = importlib.util.spec_from_file_location("g", {str(GEMMA_CONFIG)!r})\n'
      'gemma = importlib.util.module_from_spec(spec); spec.loader.exec_module(gemma)\n'
      'get_config = gemma.get_config\n'
      'def get_sweep(arg=None):\n'
      '  return [dict(drafters=("ngram",)), dict(drafters=("hydra",))]\n')
  result = subprocess.run(
      [sys.executable, '-m', 'specjax.sweep', f'--config={config_file}',
       f'--config.output_dir={tmp_path / "out"}'],
      capture_output=True, text=True, cwd=ROOT, timeout=300,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'SPECJAX_CACHE_DIR': str(tmp_path / 'cache')})
  assert result.returncode != 0
  assert "sweep cell 2 (drafters=hydra): config.drafters holds unknown drafter 'hydra'" in (
      result.stderr)
  assert 'Traceback' not in result.stderr
  assert not (tmp_path / 'out').exists()


# ---------------------------------------------------------------- running


def test_cells_record_rows_and_provenance_and_share_the_baseline(tmp_path, monkeypatch):
  calls = collections.Counter()
  real_ar = methods.autoregressive.generate

  def counting_ar(*args, **kw):
    calls['autoregressive'] += 1
    return real_ar(*args, **kw)

  monkeypatch.setattr(methods.autoregressive, 'generate', counting_ar)
  real_clear = jax.clear_caches
  monkeypatch.setattr(jax, 'clear_caches', lambda: (calls.update(['clear_caches']), real_clear()))
  config = tiny_config(tmp_path)
  records = experiment.run_sweep(config, [dict(gamma=2), dict(gamma=3)])
  assert calls['autoregressive'] == 3 + 1  # three prompts, one compile run; none in cell two
  assert calls['clear_caches'] == 2  # compiled programs dropped after each cell
  assert [r['status'] for r in records] == ['ok', 'ok']
  assert read_cells(config.output_dir) == records
  for record, gamma in zip(records, (2, 3)):
    assert record['overrides'] == {'gamma': gamma}
    assert record['methods']['ngram']['gamma'] == gamma
    assert {(r['method'], r['prompt_id']) for r in record['rows']} == {
        (m, p) for m in ('autoregressive', 'ngram') for p in ('p1', 'p2', 'p3')}
    assert record['device_kind'] and record['jax_version'] and record['date'].endswith('Z')
    assert 'git_commit' in record
  assert records[0]['run_dir'] == records[1]['run_dir']
  table = (pathlib.Path(config.output_dir) / 'sweep.md').read_text()
  assert '| gamma=2: ngram |' in table and '| gamma=3: ngram |' in table


def test_a_failing_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
  config = tiny_config(tmp_path, drafters=())
  # 8 cache slots cannot hold a prompt plus 6 new tokens: that cell fails when it packs a batch.
  sweep = [dict(batch_size=1), dict(max_cache_len=8), dict(batch_size=2)]
  records = sweep_runner.run_sweep(config, sweep)
  assert [r['status'] for r in records] == ['ok', 'error', 'ok']
  assert 'cache slots' in records[1]['error'] and records[1]['traceback']
  assert len(records[2]['rows']) == 3
  assert '## Failed cells' in (pathlib.Path(config.output_dir) / 'sweep.md').read_text()
  # A rerun retries the failed cell only; its new record is appended, none is rewritten.
  before = (pathlib.Path(config.output_dir) / 'cells.jsonl').read_text()
  sweep_runner.run_sweep(config, sweep)
  after = (pathlib.Path(config.output_dir) / 'cells.jsonl').read_text()
  assert after.startswith(before)
  assert [r['label'] for r in read_cells(config.output_dir)] == [
      'batch_size=1', 'max_cache_len=8', 'batch_size=2', 'max_cache_len=8']


def test_a_directory_holding_another_sweep_is_refused(tmp_path):
  sweep_runner.run_sweep(tiny_config(tmp_path, drafters=()), [dict(batch_size=1)])
  out = pathlib.Path(tiny_config(tmp_path).output_dir)
  before = (out / 'cells.jsonl').read_bytes()
  with pytest.raises(ConfigError, match='max_new_tokens'):
    sweep_runner.run_sweep(tiny_config(tmp_path, drafters=(), max_new_tokens=5),
                           [dict(batch_size=1)])
  assert (out / 'cells.jsonl').read_bytes() == before


SWEEP_FILE = '''
import importlib.util
spec = importlib.util.spec_from_file_location('gemma', {gemma!r})
gemma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gemma)


def get_config(arg=None):
  c = gemma.get_config(arg)
  c.update(dict(model='tiny-random', prompts={prompts!r}, max_new_tokens=8, drafters=('ngram',),
                output_dir={out!r}))
  return c


def get_sweep(arg=None):  # three cells, each compiling a new program: time to kill in
  return [dict(gamma=2), dict(gamma=3), dict(gamma=3, temperature=1.0)]
'''


def test_a_killed_sweep_restarts_and_ends_with_one_record_per_cell(tmp_path):
  prompts = write_lines(tmp_path / 'prompts.jsonl', [
      json.dumps({'id': 'p1', 'category': 'alpha', 'prompt': 'abc abc abc abc'}),
      json.dumps({'id': 'p2', 'category': 'beta', 'prompt': 'hello hello'}),
  ])
  out = tmp_path / 'out'
  config_file = tmp_path / 'tiny_sweep.py'
  config_file.write_text(SWEEP_FILE.format(gemma=str(GEMMA_CONFIG),
                                           prompts=prompts, out=str(out)))
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu',
         'SPECJAX_CACHE_DIR': str(fresh_cache_dir(tmp_path / 'cache'))}
  command = [sys.executable, '-m', 'specjax.sweep', f'--config={config_file}']
  out = tmp_path / 'out-sweep'   # the file's own output_dir, left as is: the sweep adds -sweep
  cells = out / 'cells.jsonl'

  process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  try:
    deadline = time.monotonic() + 300
    while not (cells.exists() and cells.read_text().count('\n') >= 1):
      assert process.poll() is None, 'the sweep ended before writing a cell'
      assert time.monotonic() < deadline, 'no cell written in 300 s'
      time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
  finally:
    process.kill()
    process.wait()
  first = cells.read_text()
  assert 1 <= first.count('\n') < 3, 'the kill must land before the last cell'

  # The same sweep through the other spelling of the command.
  result = subprocess.run([sys.executable, '-m', 'specjax.run', f'--config={config_file}',
                           '--sweep'], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  records = read_cells(out)
  assert cells.read_text().startswith(first)  # finished cells are neither rerun nor rewritten
  assert [r['label'] for r in records] == ['gamma=2', 'gamma=3', 'gamma=3,temperature=1.0']
  assert [(r['status'], len(r['rows'] or ())) for r in records] == [('ok', 4)] * 3, [
      r['error'] for r in records]
  greedy_dir, sampled_dir = records[0]['run_dir'], records[2]['run_dir']
  for run_dir, expected in ((greedy_dir, 2 + 2 * 2), (sampled_dir, 2 + 2)):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, 'results.jsonl'))]
    keys = [(r['prompt_id'], r['method'], r['fingerprint']) for r in rows]
    assert len(keys) == len(set(keys)) == expected  # no row computed twice, none lost
  assert (tmp_path / 'cache' / 'jax-compile').is_dir()  # the entry point enabled the cache
