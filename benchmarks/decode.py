"""specjax autoregressive greedy decoding against Hugging Face transformers' `generate`.

Gemma 3 270M from the embedded GGUF, float32, batch 1, greedy, on the CPU with
`--threads` threads, on the same token ids (specjax's tokenizer, the raw
built-in completion prompts and BOS) for both. EOS is ignored so both sides generate exactly
`--max_new_tokens` tokens. One run prints, as ratios measured in that run:

  * end-to-end tokens/s (prefill included) per prompt and overall;
  * decode-only ms/token: (time of N tokens - time of 1 token) / (N - 1);
  * time to first token, cold (the first generate call of the process, so
    specjax's includes jit compilation) and warm (the same call again);
  * compilation (specjax: first call of each shape minus its steady time);
  * weight loading (specjax: `load_checkpoint` + `device_put`, and whether its
    converted-weights cache was hit; transformers: `load_hf_model`);
  * peak RSS: each side runs in its own subprocess (this script re-invoked
    with `--side=specjax|hf`), so each peak is that side's alone;
  * how many prompts' greedy tokens are identical on both sides.

The two subprocesses load one after the other, then take turns call by call
(alternating which goes first), so load from other jobs on the machine falls
on both sides alike. Steady-state figures are the median of `--repeats` timed
calls after one untimed call of each shape; an "all, best of" row gives the
fastest call of each instead, the least disturbed by other jobs. The load
average is printed at start, after loading and at the end.

  .venv/bin/python benchmarks/decode.py --max_new_tokens=64

`--cold_cache` points SPECJAX_CACHE_DIR at an empty temporary directory, so
specjax converts the GGUF from scratch. Writes `report.md` and `raw.json` to
`--out`. Needs the `compare` extra (torch CPU, transformers, accelerate).
"""

from __future__ import annotations

import datetime
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
from absl import logging

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Tokens generated per prompt (N).')
NUM_PROMPTS = flags.DEFINE_integer('num_prompts', 4, 'Built-in prompts, spread over lengths.')
REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed calls per prompt and length (median kept).')
THREADS = flags.DEFINE_integer('threads', 2, 'CPU threads (torch threads; CPU affinity for both).')
COLD_CACHE = flags.DEFINE_bool('cold_cache', False,
                               'Load specjax weights through an empty temporary weight cache.')
OUT = flags.DEFINE_string('out', 'results/bench_decode', 'Output directory.')
SIDE = flags.DEFINE_enum('side', None, ['specjax', 'hf'], 'Internal: run one side only.')


def _peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _limit_cpus(threads: int) -> None:
  """Pins the process to `threads` cores, so XLA's and torch's pools see the same CPUs."""
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) > threads:
    os.sched_setaffinity(0, cpus[:threads])


def _timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def load_specjax():
  """(load report, generate(ids, max_new) -> (tokens, shape)); nothing is generated yet."""
  start = time.perf_counter()
  import jax  # pylint: disable=g-import-not-at-top
  from specjax import checkpoints  # pylint: disable=g-import-not-at-top
  from specjax.checkpoints import embedded, weight_cache  # pylint: disable=g-import-not-at-top
  from specjax.decoding import autoregressive, batch  # pylint: disable=g-import-not-at-top
  from specjax.models import q8_weights  # pylint: disable=g-import-not-at-top
  from specjax.models.language_model import LanguageModel  # pylint: disable=g-import-not-at-top
  info = {'import_s': time.perf_counter() - start, 'jax': jax.__version__,
          'devices': [str(d) for d in jax.devices()]}
  cache_dir = weight_cache.default_cache_dir()
  complete_before = {p.name for p in cache_dir.glob(f'params-v{weight_cache.FORMAT_VERSION}-*')
                     if (p / weight_cache.COMPLETE_MARKER).exists()} if cache_dir.is_dir() else set()
  (config, params), info['load_checkpoint_s'] = _timed(
      lambda: checkpoints.load_checkpoint(embedded.EMBEDDED_NAME))
  # The int8 forms of the matrices, as the product serves them (models/q8_weights): split
  # once (~2 s), then read back from the weight cache (~0.2 s).
  from specjax.experiments import loading  # pylint: disable=g-import-not-at-top
  params, info['int8_forms_s'] = _timed(lambda: q8_weights.with_q8_weights(
      params, forms=loading.cached_forms(embedded.EMBEDDED_NAME, params)))
  info['head_int8'] = q8_weights.HEAD_FORM in params
  params, info['device_put_s'] = _timed(lambda: jax.block_until_ready(jax.device_put(params)))
  info['load_s'] = info['load_checkpoint_s'] + info['int8_forms_s'] + info['device_put_s']
  entry = weight_cache.entry_dir(weight_cache.file_sha256(embedded.default_gguf_path()))
  info.update(cache_dir=str(cache_dir), cache_hit=entry.name in complete_before)
  model = LanguageModel(config)

  def generate(ids, max_new):
    tokens = autoregressive.generate(model, params, [ids], max_new_tokens=max_new,
                                     eos_ids=()).new_tokens[0]
    packed = batch.pack([ids], max_new_tokens=max_new, max_slots=config.max_position)
    return tokens, [packed.prefill_len, packed.num_slots, max_new]
  return info, generate


def load_hf(threads: int):
  """The same for transformers' greedy `generate` through benchmarks/hf_reference.py."""
  start = time.perf_counter()
  sys.path.insert(0, _HERE)
  import hf_reference  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
  info = {'import_s': time.perf_counter() - start, 'torch': torch.__version__,
          'transformers': transformers.__version__}
  gguf_path = embedded.default_gguf_path()
  (model, _), info['load_s'] = _timed(lambda: hf_reference.load_hf_model(gguf_path, threads))
  info['torch_threads'] = torch.get_num_threads()
  # load_hf_model also builds the tokenizer from the GGUF; time that part alone.
  info['peak_rss_after_load_mib'] = _peak_rss_mib()
  directory, name = os.path.split(os.path.abspath(gguf_path))
  _, info['tokenizer_load_s'] = _timed(lambda: transformers.AutoTokenizer.from_pretrained(
      directory, gguf_file=name, local_files_only=True))

  def generate(ids, max_new):
    return hf_reference.hf_greedy_generate(model, ids, max_new, ignore_eos=True)[0], None
  return info, generate


def serve(side: str, threads: int) -> None:
  """A side's subprocess: loads, then times `generate` requests read as JSON lines on stdin."""
  replies = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)  # stray prints (progress bars) must not mix with the replies

  def reply(value):
    replies.write(json.dumps(value) + '\n')
    replies.flush()

  info, generate = load_specjax() if side == 'specjax' else load_hf(threads)
  info.setdefault('peak_rss_after_load_mib', _peak_rss_mib())
  reply(info)
  for line in sys.stdin:
    request = json.loads(line)
    if request['op'] == 'exit':
      reply({'peak_rss_end_mib': _peak_rss_mib()})
      return
    (tokens, shape), seconds = _timed(lambda: generate(request['ids'], request['max_new']))
    reply({'s': seconds, 'tokens': [int(t) for t in tokens], 'shape': shape})


class Side:
  """A side's subprocess, started and loaded; `generate` asks it for one timed call."""

  def __init__(self, name: str, threads: int, env_extra: dict):
    cmd = [sys.executable, os.path.abspath(__file__), f'--side={name}', f'--threads={threads}']
    logging.info('starting %s', shlex.join(cmd))
    self.name = name
    self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, **env_extra})
    self.info = self._read()

  def _read(self) -> dict:
    line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f'the {self.name} side exited with status {self._proc.wait()}')
    return json.loads(line)

  def _ask(self, request: dict) -> dict:
    self._proc.stdin.write(json.dumps(request) + '\n')
    self._proc.stdin.flush()
    return self._read()

  def generate(self, ids, max_new) -> dict:
    return self._ask({'op': 'generate', 'ids': ids, 'max_new': max_new})

  def close(self) -> None:
    self.info.update(self._ask({'op': 'exit'}))
    self._proc.wait()


def measure(sides: list[Side], prompts: list[dict], n: int, repeats: int) -> None:
  """Interleaves the sides call by call, so load from other jobs falls on both alike."""
  for key in ('ttft_cold_s', 'ttft_warm_s'):  # the first generate of each process, then again
    for side in sides:
      out = side.generate(prompts[0]['ids'], 1)
      side.info.update({key: out['s'], 'rows': [], 'seen_shapes': [out['shape']]})
  for p in prompts:
    rows = {}
    for side in sides:  # one untimed call of each shape first
      rows[side.name] = row = {'id': p['id']}
      for key, max_new in (('one', 1), ('full', n)):
        first = side.generate(p['ids'], max_new)
        row.update({f'{key}_first_s': first['s'], f'{key}_times_s': [],
                    f'{key}_new_shape': first['shape'] is not None
                                        and first['shape'] not in side.info['seen_shapes']})
        side.info['seen_shapes'].append(first['shape'])
    for r in range(repeats):
      for side in (sides if r % 2 == 0 else sides[::-1]):
        row = rows[side.name]
        for key, max_new in (('one', 1), ('full', n)):
          out = side.generate(p['ids'], max_new)
          row[f'{key}_times_s'].append(out['s'])
        row['tokens'] = out['tokens']
    for side in sides:
      row = rows[side.name]
      for key in ('one', 'full'):
        row[f'{key}_s'] = statistics.median(row[f'{key}_times_s'])
        row[f'{key}_best_s'] = min(row[f'{key}_times_s'])
      row['compile_s'] = sum(max(0.0, row[f'{k}_first_s'] - row[f'{k}_s'])
                             for k in ('one', 'full') if row[f'{k}_new_shape'])
      side.info['rows'].append(row)
    logging.info('%s: %s', p['id'], ', '.join(
        f"{s.name} {n / rows[s.name]['full_s']:.1f} tok/s" for s in sides))
  for side in sides:
    side.info['compile_s'] = (side.info['ttft_cold_s'] - side.info['ttft_warm_s']
                              + sum(r['compile_s'] for r in side.info['rows']))


def choose_prompts(num: int) -> tuple[list[dict], dict]:
  """`num` built-in prompts spread from shortest to longest, tokenized by specjax."""
  from specjax.checkpoints import embedded  # pylint: disable=g-import-not-at-top
  from specjax.experiments import prompts as prompts_lib  # pylint: disable=g-import-not-at-top
  from specjax.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  tokenizer, seconds = _timed(lambda: Tokenizer.from_gguf(embedded.default_gguf_path()))
  encoded = sorted(
      ({'id': p.id, 'ids': tokenizer.encode(p.text, add_bos=True)}   # raw text: a base model
       for p in prompts_lib.load_prompts('')), key=lambda p: (len(p['ids']), p['id']))
  num = min(num, len(encoded))
  picks = sorted({round(i * (len(encoded) - 1) / max(1, num - 1)) for i in range(num)})
  return [encoded[i] for i in picks], {'specjax_tokenizer_load_s': seconds}


def _first_difference(a, b):
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return None if len(a) == len(b) else min(len(a), len(b))


def _overall(rows_a, rows_b, n, stat):
  """(tok/s a, tok/s b, b/a time ratio, decode ms a, decode ms b, ratio) over all prompts."""
  full_a = sum(r[f'full{stat}'] for r in rows_a)
  full_b = sum(r[f'full{stat}'] for r in rows_b)
  dec_a = sum(r[f'full{stat}'] - r[f'one{stat}'] for r in rows_a) / (n - 1) / len(rows_a)
  dec_b = sum(r[f'full{stat}'] - r[f'one{stat}'] for r in rows_b) / (n - 1) / len(rows_b)
  k = len(rows_a)
  return k * n / full_a, k * n / full_b, full_b / full_a, 1e3 * dec_a, 1e3 * dec_b, dec_b / dec_a


def report(raw: dict) -> str:
  sj, hf, n = raw['specjax'], raw['hf'], raw['max_new_tokens']
  lines = [
      f"# specjax vs transformers greedy decoding ({raw['date']})", '',
      f"Command: `{raw['command']}`", '',
      f"Gemma 3 270M (embedded Q4_K_M GGUF, float32), batch 1, greedy, N={n} new tokens "
      f"(EOS ignored), {raw['threads']} threads; each figure is the median of {raw['repeats']} "
      f"calls, the two sides' calls interleaved; jax {sj['jax']}, torch {hf['torch']}, "
      f"transformers {hf['transformers']}.",
      f"Load average (1/5/15 min) on {raw['cpu_count']} CPUs: start {raw['loadavg_start']}, "
      f"after loading {raw['loadavg_loaded']}, end {raw['loadavg_end']}.", cpu_info.describe(), '',
      '| prompt | prompt tokens | specjax tok/s | transformers tok/s | specjax / transformers | '
      'specjax decode ms/token | transformers decode ms/token | transformers / specjax | '
      'tokens match |',
      '|---|---|---|---|---|---|---|---|---|']
  identical = 0
  for p, a, b in zip(raw['prompts'], sj['rows'], hf['rows']):
    sj_dec = (a['full_s'] - a['one_s']) / (n - 1)
    hf_dec = (b['full_s'] - b['one_s']) / (n - 1)
    diff = _first_difference(a['tokens'], b['tokens'])
    identical += diff is None
    match = 'yes' if diff is None else f'no, first differs at {diff}'
    lines.append(f"| {p['id']} | {len(p['ids'])} | {n / a['full_s']:.1f} | {n / b['full_s']:.1f} | "
                 f"{b['full_s'] / a['full_s']:.2f}x | {1e3 * sj_dec:.1f} | {1e3 * hf_dec:.1f} | "
                 f"{hf_dec / sj_dec:.2f}x | {match} |")
  k = len(sj['rows'])
  overall = _overall(sj['rows'], hf['rows'], n, '_s')
  best = _overall(sj['rows'], hf['rows'], n, '_best_s')
  for label, v, extra in (('all', overall, f'{identical}/{k} identical'),
                          (f"all, best of {raw['repeats']}", best, '')):
    lines.append(f'| {label} | | {v[0]:.1f} | {v[1]:.1f} | {v[2]:.2f}x | {v[3]:.1f} | {v[4]:.1f} | '
                 f'{v[5]:.2f}x | {extra} |')
  cache = 'hit' if sj['cache_hit'] else 'miss: converted from the GGUF'
  lines += [
      '', '| one-off cost | specjax | transformers | transformers / specjax |', '|---|---|---|---|',
      f"| weight load, s | {sj['load_s']:.2f} (weight cache {cache}; load_checkpoint "
      f"{sj['load_checkpoint_s']:.2f} + int8 forms {sj.get('int8_forms_s', 0):.2f} "
      f"({'head served from int8' if sj.get('head_int8') else 'none'}) + device_put "
      f"{sj['device_put_s']:.2f}; memory-mapped, "
      f"pages read on first use) | {hf['load_s']:.2f} (of which its GGUF tokenizer alone takes "
      f"{hf['tokenizer_load_s']:.2f}) | {hf['load_s'] / sj['load_s']:.2f}x |",
      f"| time to first token, cold (first call of the process), s | {sj['ttft_cold_s']:.2f} | "
      f"{hf['ttft_cold_s']:.2f} | {hf['ttft_cold_s'] / sj['ttft_cold_s']:.2f}x |",
      f"| time to first token, warm (same call again), ms | {1e3 * sj['ttft_warm_s']:.1f} | "
      f"{1e3 * hf['ttft_warm_s']:.1f} | {hf['ttft_warm_s'] / sj['ttft_warm_s']:.2f}x |",
      f"| compilation, all shapes, s | {sj['compile_s']:.2f} | - | - |",
      f"| imports, s | {sj['import_s']:.2f} | {hf['import_s']:.2f} | "
      f"{hf['import_s'] / sj['import_s']:.2f}x |",
      f"| peak RSS after load, MiB | {sj['peak_rss_after_load_mib']:.0f} | "
      f"{hf['peak_rss_after_load_mib']:.0f} | "
      f"{hf['peak_rss_after_load_mib'] / sj['peak_rss_after_load_mib']:.2f}x |",
      f"| peak RSS at end, MiB | {sj['peak_rss_end_mib']:.0f} | {hf['peak_rss_end_mib']:.0f} | "
      f"{hf['peak_rss_end_mib'] / sj['peak_rss_end_mib']:.2f}x |",
      '', f"Goal specjax tok/s >= 2.5x transformers': {'met' if overall[2] >= 2.5 else 'NOT met'} "
      f"({overall[2]:.2f}x overall; {best[2]:.2f}x best of {raw['repeats']}).", '']
  return '\n'.join(lines)


def _loadavg():
  return [round(x, 2) for x in os.getloadavg()]


def main(argv):
  del argv
  _limit_cpus(THREADS.value)
  if SIDE.value:
    serve(SIDE.value, THREADS.value)
    return
  if MAX_NEW.value < 2:
    raise app.UsageError('--max_new_tokens must be >= 2 (decode time is N tokens minus 1)')
  raw = {'command': shlex.join([os.path.relpath(sys.executable), *sys.argv]),
         'date': datetime.datetime.now().isoformat(timespec='seconds'),
         'loadavg_start': _loadavg(), 'cpu_count': os.cpu_count(),
         'max_new_tokens': MAX_NEW.value, 'threads': THREADS.value, 'repeats': REPEATS.value,
         'cold_cache': COLD_CACHE.value}
  raw['prompts'], tok = choose_prompts(NUM_PROMPTS.value)
  raw.update(tok)
  with tempfile.TemporaryDirectory(prefix='specjax-cold-cache-') as cold:
    # Loaded one after the other, so neither load competes with the other.
    sides = [Side('specjax', THREADS.value, {'SPECJAX_CACHE_DIR': cold} if COLD_CACHE.value else {}),
             Side('hf', THREADS.value, {})]
    raw['loadavg_loaded'] = _loadavg()
    measure(sides, raw['prompts'], MAX_NEW.value, REPEATS.value)
    for side in sides:
      side.close()
      raw[side.name] = side.info
  raw['loadavg_end'] = _loadavg()
  text = report(raw)
  print(text)
  os.makedirs(OUT.value, exist_ok=True)
  with open(os.path.join(OUT.value, 'report.md'), 'w') as f:
    f.write(text)
  with open(os.path.join(OUT.value, 'raw.json'), 'w') as f:
    json.dump(raw, f, indent=1)


if __name__ == '__main__':
  app.run(main)
