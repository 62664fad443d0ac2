"""Speculative decoding against autoregressive decoding, as a user runs it, in one run.

Gemma 3 270M (the embedded GGUF, float32), greedy, raw-text prompts (the model
is a base model: wrapped in chat turns it repeats the prompt, which inflates
what n-gram drafting copies): Spec-Bench's first `--per_category` prompts of
each task (first turn) plus the built-in completion set. Prints, with the CPU
model and flags:

  1. step costs: a target call over n + 1 positions against a decode step, at
     every cache length the prompts ran with (`step_costs.measure`);
  2. batch 1, Spec-Bench's way: per task, speedup = mean tokens/s of a method
     over that of autoregressive decoding on the same prompts, mean accepted
     tokens per target call (plain decoding = 1.00), share of plain steps, and
     for fixed gamma the speedup predicted from the measured acceptance and step
     costs (efficiency = measured / predicted);
  3. adaptive draft length against the best fixed gamma, per task;
  4. batch sizes `--batch_sizes`: speculative tokens/s over autoregressive
     tokens/s of the same batch size.

Methods are `ngram@G` (fixed: gamma G drafts verified every step) and
`ngram~G` (adaptive: up to G, by evidence and measured costs, over the default
widths 0, the even counts below G, and G); `ngram~G:0-1-2-G` sets the widths the adaptive
policy chooses among (each one a branch of the compiled program);
`ngram~G/T` sets its finish_softness to T tokens (`inf`: the mean over rows,
the rule before the finishing time counted), `ngram~G/T/S` its
outcome_samples to S (0: a call valued at each row's expected tokens, the rule
before outcomes counted), and `ngram~G/T/S/pool` switches on pool_rows (a
row's prior mean is the other rows' pooled acceptance), to compare them side
by side.
Compilation is excluded (each program runs once untimed first). Every method
runs on a prompt, or a batch of prompts, before the next prompt or batch, and
with `--repeats` R the methods take turns R times and each keeps its fastest
run, so that the machine's drift between runs falls on all methods alike. Rows go to
`<out>/rows.jsonl` as they are measured, and a rerun resumes from them.

  .venv/bin/python benchmarks/speculative.py --per_category=2 --max_new_tokens=128
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
import zlib

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from specjax import checkpoints
from specjax import compile_cache
from specjax.checkpoints import embedded
from specjax.decoding import autoregressive, draft_length, program, speculative, step_costs
from specjax.drafters import make_drafter
from specjax.experiments import prompts as prompts_lib
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from specjax.tokenizer import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

_HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC_BENCH = os.path.join(_HERE, '..', '..', 'shared', 'data', 'spec_bench_question.jsonl')

PROMPTS = flags.DEFINE_string('prompts', _SPEC_BENCH, 'Spec-Bench question.jsonl ("" = none).')
PER_CATEGORY = flags.DEFINE_integer('per_category', 2, 'Prompts per Spec-Bench task (0: all).')
TASKS = flags.DEFINE_list('tasks', [], 'Only these Spec-Bench tasks (empty: all 13).')
BUILTIN = flags.DEFINE_bool('builtin', True, 'Also run the built-in completion prompts.')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 128, 'Tokens generated per prompt.')
FIXED = flags.DEFINE_list('gammas', ['2', '4', '6', '8'], 'Fixed draft lengths (ngram@G).')
ADAPTIVE = flags.DEFINE_list('adaptive_gammas', ['4', '8'], 'Adaptive maxima (ngram~G).')
BATCH_SIZES = flags.DEFINE_list('batch_sizes', ['1', '4', '8', '16'], 'Batch-size section.')
BATCH_METHODS = flags.DEFINE_list('batch_methods', ['ngram@4', 'ngram~4'],
                                  'Methods of the batch-size section.')
REPEATS = flags.DEFINE_integer(
    'repeats', 1, 'Rounds of timed runs on each prompt or batch (after an untimed first '
    'run), every method once per round in turn; each keeps its fastest. Timings on a shared '
    '2-core machine move by 5-10% between runs of the same program.')
OUT = flags.DEFINE_string('out', 'results/bench_speculative', 'Output directory.')
REPORT_ONLY = flags.DEFINE_bool('report_only', False,
                                'Run nothing new: report from the rows already in --out.')


def _prompt_set(tokenizer):
  chosen = []
  if PROMPTS.value:
    if not os.path.exists(PROMPTS.value):
      sys.exit(f'Spec-Bench prompts not found at {PROMPTS.value} (see ../shared/data/README.md)')
    by_task = collections.defaultdict(list)
    for p in prompts_lib.load_prompts(PROMPTS.value):
      if not TASKS.value or p.category in TASKS.value:
        by_task[p.category].append(p)
    chosen += [p for task in by_task.values()
               for p in (task[:PER_CATEGORY.value] if PER_CATEGORY.value else task)]
  if BUILTIN.value:
    chosen += [p for p in prompts_lib.load_prompts('')]
  ids = {p.id: tokenizer.encode(p.text, add_bos=True) for p in chosen}   # raw text
  return chosen, ids


def _gamma(method: str) -> int:
  """G of `ngram@G`, `ngram~G`, `ngram~G:0-2-G` or `ngram~G/T`."""
  return int(method[6:].split('/')[0].split(':')[0])


def _buckets(method: str) -> tuple[int, ...]:
  """The widths of an adaptive method: `ngram~G:0-2-G`'s, else the default ones."""
  spec = method.split('/')[0]
  if ':' not in spec:
    return draft_length.default_buckets(_gamma(method))
  return tuple(int(n) for n in spec.split(':')[1].split('-'))


class Methods:
  """Runs a method on a batch of prompts: autoregressive, ngram@G or ngram~G."""

  def __init__(self, model, params, eos):
    self.model, self.params, self.eos = model, params, eos
    self.ngram = make_drafter('ngram', target=model)
    self._seconds = {}
    self._costs = {}
    self.compiled = set()
    self._batch = None

  def batch_size(self, batch):
    """Drops every compiled program when the batch size changes. Each one stays
    mapped in memory while jax keeps it, and a run of every method at every
    batch size went past the kernel's limit of memory maps (65,530; LLVM:
    'Cannot allocate memory'); programs of another batch size are not needed
    again. The next run of each program is then its untimed first one again."""
    if batch != self._batch:
      jax.clear_caches()
      self.compiled.clear()
      self._batch = batch

  def seconds(self, width, batch, slots):
    """Seconds of a target call over `width` positions (memoised per shape)."""
    key = (width, batch, slots)
    if key not in self._seconds:
      self._seconds[key] = step_costs.seconds_per_call(self.model, self.params, width,
                                                       batch=batch, num_slots=slots, greedy=True)
    return self._seconds[key]

  def costs(self, buckets, batch, slots):
    """What the policy weighs, measured as `run` measures it (`step_costs.measure`:
    every width timed in each round, so a slow spell falls on all of them; timed
    one after the other, two runs put a batch-4 call over 3 positions at 1.32 and
    1.51 decode steps). Memoised per shape, so every batch of a shape runs with
    the same costs."""
    key = (buckets, batch, slots)
    if key not in self._costs:
      self._costs[key] = step_costs.measure(self.model, self.params, buckets, batch=batch,
                                            num_slots=slots)
    return self._costs[key]

  def policy(self, method, packed):
    gamma, adaptive = _gamma(method), method[5] == '~'
    if not adaptive:
      return draft_length.fixed(gamma)
    parts = method.split('/')
    softness = float(parts[1]) if len(parts) > 1 else draft_length.Policy.finish_softness
    samples = int(parts[2]) if len(parts) > 2 else draft_length.Policy.outcome_samples
    pool = parts[3] == 'pool' if len(parts) > 3 else draft_length.Policy.pool_rows
    batch, slots = packed.tokens_BxS.shape
    buckets = _buckets(method)
    costs = self.costs(buckets, batch, slots)
    logging.info('costs %s at batch %d, %d slots: %s', buckets, batch, slots, costs)
    return speculative.make_policy(gamma, batch, buckets=buckets, costs=costs,
                                   finish_softness=softness, outcome_samples=samples,
                                   pool_rows=pool)

  def prepare(self, method, prompts, row_ids):
    """The call that runs `method` on these prompts (compiled and run once, untimed),
    its packed batch, and the policy's costs (None for the baseline)."""
    gamma = 0 if method == 'autoregressive' else _gamma(method)
    packed = program.pack(self.model, prompts, max_new_tokens=MAX_NEW.value,
                          extra_slots=gamma + 1, row_ids=row_ids)
    costs = None
    if method == 'autoregressive':
      call = lambda: autoregressive.generate(self.model, self.params, packed,  # noqa: E731
                                             max_new_tokens=MAX_NEW.value, eos_ids=self.eos)
    else:
      policy = self.policy(method, packed)
      costs = list(policy.costs)
      call = lambda: speculative.generate(self.model, self.params, self.ngram, packed,  # noqa: E731
                                          gamma=gamma, max_new_tokens=MAX_NEW.value,
                                          eos_ids=self.eos, policy=policy)
    if (method, packed.bucket) not in self.compiled:
      call()
      self.compiled.add((method, packed.bucket))
    return call, packed, costs


def timed_runs(calls: dict, repeats: int) -> dict:
  """Each call's results over `repeats` rounds, every call once per round in turn,
  so that a slow spell of the machine falls on all methods alike."""
  results = {m: [] for m in calls}
  for _ in range(max(1, repeats)):
    for m, call in calls.items():
      results[m].append(call())
  return results


def _rows(path):
  rows = {}
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      for line in f:
        if line.strip():
          row = json.loads(line)
          rows[row['key']] = row
  return rows


def main(argv):
  del argv
  os.makedirs(OUT.value, exist_ok=True)
  compile_cache.enable()
  print(cpu_info.describe())
  config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  model = LanguageModel(config)
  params = jax.device_put(q8_weights.with_q8_weights(params))  # the head as the product serves it
  tokenizer = Tokenizer.from_gguf(embedded.default_gguf_path())
  eos = (tokenizer.eos_id,)
  chosen, ids = _prompt_set(tokenizer)
  methods = (['autoregressive'] + [f'ngram@{g}' for g in FIXED.value]
             + [f'ngram~{g}' for g in ADAPTIVE.value])
  runner = Methods(model, params, eos)
  rows_path = os.path.join(OUT.value, 'rows.jsonl')
  rows = _rows(rows_path)
  start = time.time()

  # Batch 1 runs when asked for, or when there are batch-1 methods beside the baseline.
  batch_one = len(methods) > 1 or '1' in BATCH_SIZES.value
  groups = [(1, [p], methods) for p in chosen] if batch_one else []
  for b in (int(x) for x in BATCH_SIZES.value):
    if b == 1:
      continue
    groups += [(b, chosen[i:i + b], ['autoregressive'] + BATCH_METHODS.value)
               for i in range(0, len(chosen) - b + 1, b)]
  with open(rows_path, 'a', encoding='utf-8') as out:
    for n, (batch, ps, group_methods) in enumerate(groups):
      keys = {m: f'{batch}|{m}|{"+".join(p.id for p in ps)}' for m in group_methods}
      todo = [m for m in group_methods if keys[m] not in rows]
      if not todo or REPORT_ONLY.value:
        continue
      runner.batch_size(batch)
      prepared = {m: runner.prepare(m, [ids[p.id] for p in ps],
                                    [zlib.crc32(p.id.encode()) for p in ps]) for m in todo}
      runs = timed_runs({m: prepared[m][0] for m in todo}, REPEATS.value)
      for m in todo:
        _, packed, costs = prepared[m]
        result = min(runs[m], key=lambda r: r.wall_s)
        row = dict(key=keys[m], batch=batch, method=m, prompt_ids=[p.id for p in ps],
                   categories=[p.category for p in ps], slots=packed.num_slots,
                   new_tokens=[len(t) for t in result.new_tokens], wall_s=result.wall_s,
                   wall_s_runs=[r.wall_s for r in runs[m]],
                   decode_step_s=runner.seconds(1, batch, packed.num_slots),
                   steps=result.steps, width_calls=getattr(result, 'width_calls', None),
                   widths=(list(_buckets(m)) if '~' in m else
                           None if m == 'autoregressive' else [_gamma(m)]),
                   costs=costs, output_ids=result.new_tokens,
                   target_calls=getattr(result, 'target_calls', [result.steps + 1] * len(ps)),
                   plain_calls=getattr(result, 'plain_calls', None),
                   drafted=getattr(result, 'drafted_tokens', None),
                   accepted=getattr(result, 'accepted_tokens', None))
        rows[row['key']] = row
        out.write(json.dumps(row) + '\n')
        out.flush()
      logging.info('[%d/%d, %.0f s] batch %d %s: %s', n + 1, len(groups), time.time() - start,
                   batch, ps[0].id, ', '.join(
                       f"{m} {sum(rows[keys[m]]['new_tokens']) / rows[keys[m]]['wall_s']:.1f} tok/s"
                       for m in todo))

  slots = sorted({r['slots'] for r in rows.values() if r['batch'] == 1})
  cost_table = {s: {n: runner.seconds(n + 1, 1, s) for n in WIDTHS} for s in slots}
  # Figures compare methods on the same prompts: those every method has a row for.
  complete = [p for p in chosen if all(f'1|{m}|{p.id}' in rows for m in methods)]
  measured = {p.id for p in complete}
  report = '\n'.join([
      '# Speculative decoding, Gemma 3 270M, float32, greedy, raw text', '',
      cpu_info.describe(), f'jax {jax.__version__}, {MAX_NEW.value} new tokens, '
      f'{len(measured)} of {len(chosen)} prompts measured', '', costs_table(cost_table), '',
      batch1_table(rows, complete, methods, cost_table), '',
      adaptive_table(rows, complete, methods), '', batch_table(rows), '',
      batch_steps_table(rows)])
  print(report)
  with open(os.path.join(OUT.value, 'report.md'), 'w', encoding='utf-8') as f:
    f.write(report + '\n')


WIDTHS = (0, 1, 2, 3, 4, 6, 8)   # drafts verified per call (0: a decode step)


def costs_table(cost_table) -> str:
  head = ' | '.join(f'{n + 1} positions' for n in WIDTHS[1:])
  lines = [f'| cache slots | decode step ms | {head} |', '|---|---' + '|---' * (len(WIDTHS) - 1)
           + '|']
  for s, sec in cost_table.items():
    lines.append(f'| {s} | {1e3 * sec[0]:.1f} | '
                 + ' | '.join(f'{sec[n] / sec[0]:.2f}' for n in WIDTHS[1:]) + ' |')
  return 'Target call cost over a decode step (batch 1):\n\n' + '\n'.join(lines)


def _per_task(rows, chosen, method):
  out = collections.defaultdict(list)
  for p in chosen:
    r = rows.get(f'1|{method}|{p.id}')
    if r is not None:
      out[p.category].append(r)
      out['overall'].append(r)
  return out


def _tps(rs):
  return np.mean([r['new_tokens'][0] / r['wall_s'] for r in rs])


def batch1_table(rows, chosen, methods, cost_table) -> str:
  base = _per_task(rows, chosen, 'autoregressive')
  tasks = sorted(t for t in base if t != 'overall') + ['overall']
  lines = ['Batch 1, per task (speedup over autoregressive tokens/s, mean accepted tokens per '
           'target call, plain-step share, predicted speedup and efficiency for fixed gamma, '
           'identical outputs):', '',
           '| method | task | speedup | mean accepted | plain steps | predicted | efficiency | '
           'identical |', '|---|---|---|---|---|---|---|---|']
  for method in methods[1:]:
    mine = _per_task(rows, chosen, method)
    for task in tasks:
      rs, bs = mine[task], base[task]
      if not rs:
        continue
      speedup = _tps(rs) / _tps(bs)
      calls = sum(r['target_calls'][0] for r in rs)
      mean_acc = sum(r['new_tokens'][0] for r in rs) / calls
      plain = sum(r['plain_calls'][0] for r in rs) / max(1, sum(r['target_calls'][0] - 1
                                                              for r in rs))
      predicted = efficiency = '-'
      if '@' in method:
        # Both share the prefill and first token: keep the baseline's measured
        # prefill, replace its decode steps by verify calls (n-gram drafts for free).
        gamma = _gamma(method)
        pred = []
        for r, b in zip(rs, bs):
          sec = cost_table[b['slots']]
          if gamma not in WIDTHS:
            break
          prefill_s = max(0.0, b['wall_s'] - (b['target_calls'][0] - 1) * sec[0])
          verify_s = cost_table[r['slots']][gamma]   # at the slots the method ran with
          pred.append(r['new_tokens'][0] / (prefill_s + (r['target_calls'][0] - 1) * verify_s))
        if len(pred) == len(rs):
          p = np.mean(pred) / _tps(bs)
          predicted, efficiency = f'{p:.2f}x', f'{speedup / p:.2f}'
      same = np.mean([r['output_ids'] == b['output_ids'] for r, b in zip(rs, bs)])
      lines.append(f'| {method} | {task} | {speedup:.2f}x | {mean_acc:.2f} | {plain:.2f} | '
                   f'{predicted} | {efficiency} | {same:.2f} |')
  return '\n'.join(lines)


def adaptive_table(rows, chosen, methods) -> str:
  base = _per_task(rows, chosen, 'autoregressive')
  fixed = [m for m in methods if '@' in m]
  adaptive = [m for m in methods if '~' in m]
  tasks = sorted(t for t in base if t != 'overall') + ['overall']
  lines = ['Adaptive draft length against the best fixed gamma (batch 1): each adaptive '
           'method\'s speedup, and in brackets its ratio to the best fixed one\'s:', '',
           '| task | best fixed | its speedup | ' + ' | '.join(adaptive) + ' |',
           '|---|---|---|' + '---|' * len(adaptive)]
  for task in tasks:
    speed = {m: _tps(_per_task(rows, chosen, m)[task]) / _tps(base[task])
             for m in fixed + adaptive if _per_task(rows, chosen, m)[task]}
    if not speed or not any(m in speed for m in fixed):
      continue
    best = max((m for m in fixed if m in speed), key=speed.get)
    lines.append(f'| {task} | {best} | {speed[best]:.2f}x | '
                 + ' | '.join(f'{speed[m]:.2f}x ({speed[m] / speed[best]:.2f})' if m in speed
                              else '-' for m in adaptive) + ' |')
  return '\n'.join(lines)


def batch_table(rows) -> str:
  by = collections.defaultdict(lambda: [0, 0.0])
  wall = {}   # (batch, method, prompts) -> seconds
  for r in rows.values():
    by[(r['batch'], r['method'])][0] += sum(r['new_tokens'])
    by[(r['batch'], r['method'])][1] += r['wall_s']
    wall[(r['batch'], r['method'], '+'.join(r['prompt_ids']))] = r['wall_s']
  sizes = sorted({b for b, _ in by})
  methods = sorted({m for _, m in by if m != 'autoregressive'})
  lines = ['Batch sizes: tokens/s of each method over autoregressive tokens/s at the same batch '
           'size (total new tokens / total wall time), and in brackets the lowest and highest '
           'of that ratio over the batches of prompts:', '',
           '| batch | batches | autoregressive tok/s | ' + ' | '.join(methods) + ' |',
           '|---|---|---|' + '---|' * len(methods)]
  for b in sizes:
    if (b, 'autoregressive') not in by:
      continue
    ar = by[(b, 'autoregressive')][0] / by[(b, 'autoregressive')][1]
    chunks = [k for (bb, m, k) in wall if bb == b and m == 'autoregressive']
    cells = []
    for m in methods:
      if (b, m) not in by:
        cells.append('-')
        continue
      each = [wall[(b, 'autoregressive', k)] / wall[(b, m, k)] for k in chunks
              if (b, m, k) in wall]
      cells.append(f'{by[(b, m)][0] / by[(b, m)][1] / ar:.2f}x '
                   f'({min(each):.2f}-{max(each):.2f})')
    lines.append(f'| {b} | {len(chunks)} | {ar:.1f} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def batch_steps_table(rows) -> str:
  """Each batch's steps per call width, and the speedup the policy's own costs
  predict from them against the one measured: a predicted figure above the
  measured one means the calls cost more in the loop than `step_costs` says; a
  predicted figure below 1.0x means the policy chose calls that did not pay."""
  lines = ['Adaptive batches: the loop\'s steps per call width (drafts verified: steps), the '
           'speedup predicted from them at the policy\'s measured costs (the autoregressive '
           'run\'s decode steps replaced by these calls), and the speedup measured:', '',
           '| batch | method | slots | tasks | steps per width | predicted | measured |',
           '|---|---|---|---|---|---|---|']
  for r in sorted(rows.values(), key=lambda r: (r['batch'], r['method'], r['key'])):
    if r['batch'] == 1 or not r.get('costs') or not r.get('width_calls'):
      continue
    ar = rows.get(r['key'].replace(f"|{r['method']}|", '|autoregressive|'))
    if ar is None or 'steps' not in ar:
      continue
    t = r['decode_step_s']
    spec_s = ar['wall_s'] - ar['steps'] * t + t * sum(
        n * c for n, c in zip(r['width_calls'], r['costs']))
    widths = ', '.join(f'{w}: {n}' for w, n in zip(r['widths'], r['width_calls']))
    tasks = '+'.join(sorted(set(r['categories'])))
    lines.append(f"| {r['batch']} | {r['method']} | {r['slots']} | {tasks} | {widths} | "
                 f"{ar['wall_s'] / spec_s:.2f}x | {ar['wall_s'] / r['wall_s']:.2f}x |")
  return '\n'.join(lines)


if __name__ == '__main__':
  app.run(main)
