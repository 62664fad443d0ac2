"""The persistent compilation cache: a second process compiles nothing the first one did.

Each process runs a tiny-model experiment (baseline and n-gram drafter) after
`compile_cache.enable()` and reports JAX's own cache events; the cache lives
under $SPECJAX_CACHE_DIR, here a temporary directory, so the user's cache is
never touched.
"""

import json
import os
import pathlib
import subprocess
import sys

from specjax import compile_cache

from cache_dirs import fresh_cache_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHILD = '''
import collections, importlib.util, json, sys
import jax
from specjax import compile_cache, experiment

jax.numpy.ones(3) + 1  # compiled before the cache is on, as in a notebook: enable() must still work
path = compile_cache.enable(min_compile_time_s=0)
events = collections.Counter()
jax.monitoring.register_event_listener(lambda name, **kw: events.update([name]))
spec = importlib.util.spec_from_file_location('gemma', 'configs/gemma.py')
gemma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gemma)
config = gemma.get_config()
config.update(dict(model='tiny-random', prompts=sys.argv[1], max_new_tokens=8, drafters=('ngram',),
                   output_dir=sys.argv[2]))
summary, rows = experiment.run_experiment_with_rows(config)
print(json.dumps(dict(events, path=str(path), tokens=[r['output_ids'] for r in rows])))
'''


def _run_child(tmp_path, output_dir):
  """A tiny-model experiment (baseline and ngram) in a fresh process: its cache events."""
  prompts = tmp_path / 'prompts.jsonl'
  prompts.write_text(json.dumps({'id': 'p1', 'prompt': 'abc abc abc'}) + '\n')
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'SPECJAX_CACHE_DIR': str(tmp_path)}
  result = subprocess.run([sys.executable, '-c', CHILD, str(prompts), str(tmp_path / output_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_second_process_compiles_nothing(tmp_path):
  requests = '/jax/compilation_cache/compile_requests_use_cache'
  writes = '/jax/compilation_cache/cache_misses'  # JAX counts a miss when it writes the entry
  hits = '/jax/compilation_cache/cache_hits'

  fresh_cache_dir(tmp_path)
  first = _run_child(tmp_path, 'first')
  cache_dir = pathlib.Path(first['path'])
  assert cache_dir == tmp_path / compile_cache.SUBDIR
  entries = sorted(p.name for p in cache_dir.iterdir() if p.is_file())
  assert first.get(writes, 0) >= 1 and first.get(hits, 0) == 0
  assert len(entries) >= first[writes]

  second = _run_child(tmp_path, 'second')  # not a resume: every row is computed again
  assert second['tokens'] == first['tokens']
  assert second.get(writes, 0) == 0, 'the second process compiled and wrote a program again'
  assert second[hits] == second[requests] == first[requests]
  assert sorted(p.name for p in cache_dir.iterdir() if p.is_file()) == entries


def test_the_cache_sits_beside_the_weight_cache(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECJAX_CACHE_DIR', str(tmp_path))
  assert compile_cache.default_dir() == tmp_path / 'jax-compile'
  monkeypatch.delenv('SPECJAX_CACHE_DIR')
  assert compile_cache.default_dir() == pathlib.Path.home() / '.cache' / 'specjax' / 'jax-compile'
