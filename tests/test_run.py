"""`python -m specjax.run` as a user meets it: bad input, Ctrl-C, a second run at once.

Each run is a real subprocess in a fresh working directory, with a weight cache
of its own (seeded with the shared cache's tokenizers only, so the real model's
tokenizer need not be rebuilt): a bad input must end in one line naming the key
and value, with a non-zero exit code, before any weight is read, so the cache
must hold no weight entry afterwards.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from specjax.checkpoints import embedded
from specjax.drafters import draft_vocab
from specjax.checkpoints import weight_cache
from specjax.tokenizer import Tokenizer

from cache_dirs import fresh_cache_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = ROOT / 'configs' / 'gemma.py'
# Fails fast only if no weight is read: converting the 270M GGUF takes 15-35 s.
BAD_INPUT_SECONDS = 15


@pytest.fixture(scope='module')
def cache_dir(tmp_path_factory) -> pathlib.Path:
  """A weight cache holding the embedded model's tokenizer and nothing else (and the
  built CPU kernels, tests/cache_dirs.py)."""
  cache = fresh_cache_dir(tmp_path_factory.mktemp('cache'))
  shared = weight_cache.default_cache_dir() / 'tokenizers'
  if shared.is_dir():
    shutil.copytree(shared, cache / 'tokenizers')
  Tokenizer.from_gguf(embedded.default_gguf_path(), cache_dir=cache)  # ~20 s if not copied
  return cache


def weight_entries(cache: pathlib.Path) -> list[str]:
  return [p.name for p in cache.iterdir() if p.name.startswith('params-')]


def env(cache: pathlib.Path) -> dict[str, str]:
  path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
  return {**os.environ, 'PYTHONPATH': path, 'SPECJAX_CACHE_DIR': str(cache),
          'JAX_PLATFORMS': 'cpu'}


def specjax_run(args, cwd, cache, timeout=600):
  start = time.perf_counter()
  result = subprocess.run([sys.executable, '-m', 'specjax.run', *args], cwd=cwd, env=env(cache),
                          capture_output=True, text=True, timeout=timeout)
  return result, time.perf_counter() - start


def tiny_flags(prompts: pathlib.Path, max_new_tokens: int = 4) -> list[str]:
  """A tiny random target, so n-gram lookup alone: the default's hybrid drafts with the
  EAGLE head shipped for the embedded 270M, which refuses any other target."""
  return ['--config.model=tiny-random', f'--config.prompts={prompts}',
          f'--config.max_new_tokens={max_new_tokens}', '--config.chat_template=False',
          '--config.early_exit.layers=1', "--config.drafters=('ngram',)"]


def write_prompts(path: pathlib.Path, count: int) -> pathlib.Path:
  """`count` prompts of one length, so each method compiles one program."""
  path.write_text(''.join(json.dumps({'id': f'p{i:02d}', 'prompt': f'prompt {i:02d} ab ab'}) + '\n'
                          for i in range(count)), encoding='utf-8')
  return path


# ---------------------------------------------------------------- bad input


# name: (flags, with {config} and {tmp} filled in; what the one line must hold: key and value)
BAD_INPUTS = {
    'no --config': ([], ['--config']),
    'config file missing': (['--config={tmp}/nope.py'], ['--config', 'nope.py']),
    'misspelt variant': (['--config={config}:quik'], ['variant', "'quik'"]),
    'non-integer in the arg': (['--config={config}:gamma=four'], ["'gamma'", "'four'"]),
    'non-integer flag': (['--config={config}', '--config.gamma=four'], ['gamma', 'four']),
    'unknown key': (['--config={config}', '--config.gama=6'], ["'gama'"]),
    'gamma 0': (['--config={config}', '--config.gamma=0'], ['config.gamma is 0']),
    'prompts a directory': (['--config={config}', '--config.prompts={tmp}/a_dir'],
                            ['config.prompts', 'a_dir', 'directory']),
    'prompts not UTF-8': (['--config={config}', '--config.prompts={tmp}/latin1.jsonl'],
                          ['config.prompts', 'latin1.jsonl', 'UTF-8']),
    'tokenizer a directory': (['--config={config}', '--config.tokenizer={tmp}/a_dir'],
                              ['config.tokenizer', 'a_dir', 'directory']),
    'mesh over the devices': (['--config={config}', '--config.mesh_data=64'],
                              ['config.mesh_data=64', 'devices']),
    'max_new_tokens 100000': (['--config={config}', '--config.max_new_tokens=100000'],
                              ['config.max_new_tokens is 100000', 'max_cache_len']),
    'a prompt too long': (['--config={config}', '--config.max_cache_len=150'],
                          ['config.max_cache_len is 150', "prompt 'summarization-1'",
                           'too_long=skip']),
    'too_long misspelt': (['--config={config}', '--config.too_long=skp'],
                          ["config.too_long is 'skp'"]),
    'output_dir under a file': (['--config={config}', '--config.output_dir={tmp}/a_file/out'],
                                ['config.output_dir', 'a_file']),
    'draft vocabulary of another tokenizer': (
        ['--config={config}', "--config.drafters=('early_exit',)",
         '--config.early_exit.draft_vocab={tmp}/other.npz'],
        ['config.early_exit.draft_vocab', 'other.npz', 'another tokenizer']),
    'skip set naming a layer the model lacks': (
        ['--config={config}', "--config.drafters=('layer_skip',)",
         '--config.layer_skip.skip=(3,18)'],
        ['config.layer_skip.skip', '[18]', '18 layers']),
    'tree with a cycle': (['--config={config}', '--config.tree=-1,2,1'],
                          ["config.tree is '-1,2,1'", 'tree node 1 has parent 2']),
    'unknown tree preset': (['--config={config}', '--config.tree=eagle-99'],
                            ["config.tree is 'eagle-99'", 'unknown tree']),
    'tree over the cache': (['--config={config}', '--config.tree=eagle-25',
                             '--config.max_new_tokens=4075'],
                            ['config.max_new_tokens is 4075', '26 verify slots']),
}


def bad_input_files(tmp: pathlib.Path) -> None:
  (tmp / 'a_dir').mkdir()
  (tmp / 'latin1.jsonl').write_bytes('{"id": "a", "prompt": "café"}\n'.encode('latin-1'))
  (tmp / 'a_file').write_text('')
  draft_vocab.save(draft_vocab.DraftVocab(np.arange(8, dtype=np.int32), 262144, 'another-tokenizer'),
                   tmp / 'other.npz')


@pytest.mark.parametrize('case', BAD_INPUTS)
def test_a_bad_input_is_one_line_before_any_weight_loads(case, tmp_path, cache_dir):
  bad_input_files(tmp_path)
  args, expected = BAD_INPUTS[case]
  args = [a.format(config=CONFIG, tmp=tmp_path) for a in args]
  result, seconds = specjax_run(args, tmp_path, cache_dir)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1, result.stderr
  assert len(lines) == 1, result.stderr
  for text in expected:
    assert text in lines[0]
  assert seconds < BAD_INPUT_SECONDS
  assert weight_entries(cache_dir) == []
  assert not (tmp_path / 'results').exists()


# ---------------------------------------------------------------- a run interrupted, a run at once


def wait_for(predicate, process, what: str, timeout: float = 300):
  deadline = time.monotonic() + timeout
  while not predicate():
    if process.poll() is not None:
      pytest.fail(f'the run ended (rc {process.returncode}) before {what}')
    if time.monotonic() > deadline:
      process.kill()
      pytest.fail(f'timed out waiting for {what}')
    time.sleep(0.05)


def test_a_second_run_is_refused_and_ctrl_c_in_a_compile_keeps_every_row(tmp_path, cache_dir):
  """Run A holds output_dir: run B, the same command, is refused at once (it would
  write every row again). Then SIGINT reaches A while it compiles the ngram program,
  after the baseline rows: A exits 130, says how to resume, and every row is whole."""
  args = [f'--config={CONFIG}', *tiny_flags(write_prompts(tmp_path / 'p.jsonl', 6), 16),
          '--config.output_dir=out']
  # A cache of A's own: with the module's cache, an earlier test's compiled ngram
  # program is read back in milliseconds and A can finish before SIGINT arrives.
  cache_a = fresh_cache_dir(tmp_path / 'cache-a')
  shutil.copytree(cache_dir / 'tokenizers', cache_a / 'tokenizers')
  log = (tmp_path / 'a.log').open('w+')
  a = subprocess.Popen([sys.executable, '-m', 'specjax.run', *args], cwd=tmp_path,
                       env=env(cache_a), stdout=subprocess.DEVNULL, stderr=log)
  try:
    wait_for(lambda: 'Loading tiny-random' in (tmp_path / 'a.log').read_text(), a, 'A to load')
    b, _ = specjax_run(args, tmp_path, cache_dir)
    assert a.poll() is None, 'A must still hold the directory while B tries'
    assert b.returncode == 1
    assert b.stderr.strip().splitlines() == [
        f"error: config.output_dir 'out' is in use by another run (pid {a.pid} on "
        f"{os.uname().nodename}); wait for it to end, or choose another output_dir"]

    wait_for(lambda: 'ngram: compiling' in (tmp_path / 'a.log').read_text(), a,
             'A to compile the ngram program')
    a.send_signal(signal.SIGINT)
    assert a.wait(timeout=120) == 130
  finally:
    if a.poll() is None:
      a.kill()
  stderr = (tmp_path / 'a.log').read_text()
  assert stderr.rstrip().endswith(
      'interrupted; 6 rows kept in out/results.jsonl; run the same command again to resume')
  assert 'Traceback' not in stderr and 'Segmentation' not in stderr
  rows = [json.loads(line) for line in (tmp_path / 'out' / 'results.jsonl').open()]
  assert [(r['method'], r['prompt_id']) for r in rows] == [
      ('autoregressive', f'p{i:02d}') for i in range(6)]
  assert all(r['new_tokens'] >= 1 for r in rows)


# ---------------------------------------------------------------- the README's entry points

README_SNIPPET = '''
from specjax.experiment import run_experiment
import importlib.util
spec = importlib.util.spec_from_file_location('gemma', {config!r})
gemma = importlib.util.module_from_spec(spec); spec.loader.exec_module(gemma)
config = gemma.get_config('quick,drafters=ngram+early_exit')
config.update(model='tiny-random', prompts={prompts!r}, max_new_tokens=4, chat_template=False,
              early_exit=dict(layers=1))
summary = run_experiment(config)
'''


def test_the_readme_entry_points_run_one_after_another(tmp_path, cache_dir):
  """The main command, :quick, the Python snippet and --sweep each get their own default
  output_dir, so none refuses another; a real config change in one directory still is.

  The sweep's 8 points would compile 9 programs (~150 s on 2 CPU cores); with a cache
  too small for its prompt each point records the prompt as skipped instead, which
  goes through everything the entry point owns (test_experiment covers sweep decoding).
  """
  prompts = write_prompts(tmp_path / 'p.jsonl', 1)
  run_dir = tmp_path / 'fresh'
  run_dir.mkdir()
  for args in ([f'--config={CONFIG}'], [f'--config={CONFIG}:quick']):
    result, _ = specjax_run([*args, *tiny_flags(prompts)], run_dir, cache_dir)
    assert result.returncode == 0, result.stderr[-2000:]
  snippet = README_SNIPPET.format(config=str(CONFIG), prompts=str(prompts))
  result = subprocess.run([sys.executable, '-c', snippet], cwd=run_dir, env=env(cache_dir),
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-2000:]
  result, _ = specjax_run([f'--config={CONFIG}', '--sweep', *tiny_flags(prompts),
                           '--config.max_cache_len=16', '--config.too_long=skip'], run_dir,
                          cache_dir)
  assert result.returncode == 0, result.stderr[-2000:]
  results = run_dir / 'results'
  assert sorted(p.name for p in results.iterdir()) == [
      'gemma', 'gemma-quick', 'gemma-quick-drafters_ngram+early_exit', 'gemma-sweep']
  assert all((d / 'summary.md').is_file() for d in results.iterdir() if d.name != 'gemma-sweep')
  assert (results / 'gemma-sweep' / 'sweep.md').is_file()   # the sweep's table of its cells
  records = [json.loads(line) for line in (results / 'gemma-sweep' / 'cells.jsonl').open()]
  assert records and all(r['status'] == 'ok' for r in records)
  assert all('skipped' in row for r in records for row in r['rows'])

  result, _ = specjax_run([f'--config={CONFIG}', *tiny_flags(prompts, 5)], run_dir, cache_dir)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines() == [
      "error: config.output_dir 'results/gemma' holds results made under a different config "
      '(changed: max_new_tokens); pick another output_dir, or set --config.resume=False to set '
      'them aside']


def test_the_real_entry_point_derives_its_output_dir(tmp_path, cache_dir):
  """`--config=configs/gemma.py:quick` with the embedded model writes results/gemma-quick.
  A cache too small for any prompt skips them all, so no weight is loaded (or needed)."""
  result, _ = specjax_run([f'--config={CONFIG}:quick', '--config.max_cache_len=40',
                           '--config.too_long=skip'], tmp_path, cache_dir)
  assert result.returncode == 0, result.stderr[-2000:]
  out = tmp_path / 'results' / 'gemma-quick'
  rows = [json.loads(line) for line in (out / 'results.jsonl').open()]
  assert len(rows) == 12 and all('max_cache_len 40' in r['skipped'] for r in rows)  # 4 x 3 methods
  assert json.loads((out / 'config.json').read_text())['config']['limit'] == 4
  assert len(json.loads((out / 'summary.json').read_text())['skipped']) == 4
  assert weight_entries(cache_dir) == []
