r"""Where a step's time goes, kernel by kernel: the compiled program profiled.

Timing a whole step says that a verify call over 9 positions costs 1.75 decode
steps, not which part grew. This runs the product's own programs under
`jax.profiler.trace` (XLA:CPU records every thunk it executes, each custom call
and fusion by its HLO name), maps each custom call to its kernel through the
optimized HLO that XLA dumps, and prints the milliseconds per step spent in each
of specjax's kernels (`specjax_q8_matmul_f32`, `specjax_q8_argmax_f32`, ...) and
in XLA's own operations, for autoregressive decoding (width 1) and for the
speculative loop verifying a fixed gamma = width - 1 drafts of `ngram` at every
step (the drafts' acceptance does not change a call's shape).

Per-thunk tracing costs time of its own, more in a program of more thunks, so
the totals run a few percent over an untraced run's; compare the kernels'
shares and how each grows with the width, not the totals with `verify_cost.py`.
On the 2-core Zen 4 EPYC of 7 December 2026 the greedy product spent, per step
at 1 / 5 / 9 positions: the layers' int8 products 6.8 / 9.4 / 14.8 ms, the
head's argmax 5.9 / 6.2 / 7.3, attention 0.3 / 0.7 / 1.1, XLA's operations
2.1 / 2.3 / 2.5: the layers' float32 arithmetic is what grows with the width
(experiments/2026-12-zen4-gemma270m-cpu/step_profile.txt).

Gemma 3 270M (the embedded GGUF, float32, served as the product serves it),
greedy (or sampled: `--temperature`), the first raw-text Spec-Bench prompt (or
the first of `--batch` tasks, one row each); `--top_xla` also lists XLA's
costliest operations by HLO name (a fusion's name says little; the dump it
reads has them, until it is removed at the end).

  .venv/bin/python benchmarks/step_profile.py --widths=1,5,9
  .venv/bin/python benchmarks/step_profile.py --widths=1,5 --temperature=1 --batch=4 --top_xla=8
  .venv/bin/python benchmarks/step_profile.py --widths=1 --drafter=hybrid --plain_loop --top_xla=12
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

# XLA reads its flags once, when the backend starts: the HLO dump must be asked for first.
_DUMP = tempfile.mkdtemp(prefix='specjax-step-profile-')
os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + f' --xla_dump_to={_DUMP} '
                           '--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=^$').strip()

import collections  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402

from specjax import compile_cache  # noqa: E402
from specjax import sampling as sampling_lib  # noqa: E402
from specjax.decoding import autoregressive, draft_length, speculative  # noqa: E402
from specjax.drafters import make_drafter  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import served  # noqa: E402  pylint: disable=g-import-not-at-top

WIDTHS = flags.DEFINE_list('widths', ['1', '5', '9'], 'Positions a target call scores: 1 is '
                           'autoregressive decoding, w > 1 the loop verifying w - 1 drafts.')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Tokens generated.')
PROMPTS = flags.DEFINE_string('prompts', served.SPEC_BENCH, 'Spec-Bench question.jsonl.')
TEMPERATURE = flags.DEFINE_float('temperature', 0.0, '0: greedy; > 0: sampled at it.')
BATCH = flags.DEFINE_integer('batch', 1, 'Rows: the first prompt of this many Spec-Bench tasks.')
TOP_XLA = flags.DEFINE_integer('top_xla', 0, "Also list XLA's costliest operations, this many.")
DRAFTER = flags.DEFINE_enum('drafter', 'ngram', ['ngram', 'eagle', 'hybrid'],
                            "The loop's drafter (eagle and hybrid: the shipped EAGLE drafter).")
PLAIN_LOOP = flags.DEFINE_bool('plain_loop', False,
                               'Also profile the loop with every step plain (drafting priced '
                               'out, as drafter_speed.py --never_drafts): what carrying the '
                               'drafter costs a step it does not draft in.')

_INSTRUCTION = re.compile(r'%([\w.\-]+) = ')
_CUSTOM_CALL = re.compile(r'%([\w.\-]+) = .*?custom_call_target="([\w.\-]+)"')
# Instructions whose spans hold other instructions' thunks, which are counted on their own.
_CONTAINERS = ('while', 'conditional', 'call')


def _newest_program_hlo(before: set[str]) -> str:
  """The optimized HLO of the largest `jit__compiled` module dumped since `before`."""
  dumped = [p for p in glob.glob(os.path.join(_DUMP, '*jit__compiled*after_optimizations.txt'))
            if p not in before]
  if not dumped:
    raise SystemExit(f'XLA dumped no compiled program into {_DUMP}')
  return open(max(dumped, key=os.path.getsize)).read()


_XLA_PREFIX = 'XLA: '
_OPCODE = re.compile(r'^\s*(?:ROOT )?%[\w.\-]+ = [^=]*? ([a-z][\w\-]*)\(', re.M)


def _what_it_does(hlo: str, instruction: str) -> str:
  """An instruction's shape and opcode, and for a fusion the opcodes it fuses."""
  line = re.search(rf'^\s*(?:ROOT )?%{re.escape(instruction)} = (.*)$', hlo, re.M)
  if not line:
    return ''
  text = line.group(1)
  shape = text.split(' ', 1)[0]
  called = re.search(r'calls=%([\w.\-]+)', text)
  if not called:
    op = re.search(r' ([a-z][\w\-]*)\(', text)
    return f'{op.group(1) if op else "?"} {shape}'
  body = re.search(rf'^%{re.escape(called.group(1))} .*?^}}', hlo, re.M | re.S)
  ops = sorted(set(_OPCODE.findall(body.group(0)))
               - {'parameter', 'constant', 'broadcast', 'bitcast', 'reshape'}) if body else []
  return f'fusion {shape}: {", ".join(ops)}'


def _per_step(trace_dir: str, hlo: str) -> tuple[int, dict[str, float]]:
  """(steps, {kernel or 'XLA operations': ms per step}) from the trace in `trace_dir`."""
  kernels = dict(_CUSTOM_CALL.findall(hlo))
  instructions = {n for n in _INSTRUCTION.findall(hlo) if not n.startswith(_CONTAINERS)}
  (path,) = glob.glob(os.path.join(trace_dir, 'plugins', 'profile', '*', '*.trace.json.gz'))
  with gzip.open(path) as f:
    events = json.load(f)['traceEvents']
  threads = {(e['pid'], e['tid']): e['args']['name'] for e in events
             if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
  micros = collections.Counter()
  calls = collections.Counter()
  for e in events:   # the program's thunks only: not Python, the executor or the runtime
    if (e.get('ph') != 'X' or threads.get((e['pid'], e['tid'])) == 'python'
        or e['name'] not in instructions):
      continue
    name = e['name']
    kernel = kernels.get(name)
    micros[kernel or 'XLA operations'] += e['dur']
    if not kernel:
      micros[_XLA_PREFIX + name] += e['dur']
    if kernel:
      calls[name] += 1
  steps = max(calls.values())   # a kernel called once a step (the prefill's calls are others)
  return steps, {k: v / steps / 1e3 for k, v in micros.items()}, hlo


def main(argv):
  del argv
  # A fresh compilation cache: the first run of each width compiles (and XLA dumps its
  # program), the traced run reads it back instead of compiling inside the trace.
  compile_cache.enable(tempfile.mkdtemp(prefix='cache-', dir=_DUMP))
  print(cpu_info.describe())
  model, params, tokenizer = served.target()
  chosen = served.first_of_each_task(PROMPTS.value, BATCH.value)
  ids = [tokenizer.encode(p.text, add_bos=True) for p in chosen]
  sampling = sampling_lib.SamplingConfig(temperature=TEMPERATURE.value)
  if DRAFTER.value == 'ngram':
    drafter = make_drafter('ngram', target=model, target_params=params)
  else:
    drafter = make_drafter(DRAFTER.value, target=model, trained=served.shipped_eagle(model),
                           target_params=params)
  rows = {}
  widths = [int(w) for w in WIDTHS.value] + (['plain'] if PLAIN_LOOP.value else [])
  for width in widths:
    if width == 'plain':
      def run():
        return speculative.generate(model, params, drafter, ids, gamma=4,
                                    max_new_tokens=MAX_NEW.value, sampling=sampling,
                                    policy=served.PRICED_OUT)
    elif width == 1:
      def run():
        return autoregressive.generate(model, params, ids, max_new_tokens=MAX_NEW.value,
                                       sampling=sampling)
    else:
      def run(gamma=width - 1):
        return speculative.generate(model, params, drafter, ids, gamma=gamma,
                                    max_new_tokens=MAX_NEW.value, sampling=sampling,
                                    policy=draft_length.fixed(gamma))
    before = set(glob.glob(os.path.join(_DUMP, '*')))
    run()   # compiles, and dumps the program
    hlo = _newest_program_hlo(before)
    run()
    trace_dir = tempfile.mkdtemp(prefix=f'width{width}-', dir=_DUMP)
    with jax.profiler.trace(trace_dir):
      run()
    rows[width] = _per_step(trace_dir, hlo)
    print(f'width {width}: {rows[width][0]} steps traced', flush=True)
  own = lambda ms: {k: v for k, v in ms.items() if not k.startswith(_XLA_PREFIX)}
  names = sorted({k for _, ms, _ in rows.values() for k in own(ms)},
                 key=lambda k: -max(own(ms).get(k, 0.0) for _, ms, _ in rows.values()))
  how = 'greedy' if sampling.greedy else f'sampled at T = {sampling.temperature:g}'
  print(f'\njax {jax.__version__}, Gemma 3 270M float32, {how}, batch {len(ids)}, '
        f'{MAX_NEW.value} new tokens; ms per step (traced)\n')
  label = lambda w: (f'{DRAFTER.value} loop, every step plain' if w == 'plain'  # noqa: E731
                     else f'{w} position{"s" * (w > 1)}')
  print('| | ' + ' | '.join(label(w) for w in rows) + ' |')
  print('|---|' + '---|' * len(rows))
  for name in names + ['total']:
    cells = [sum(own(ms).values()) if name == 'total' else own(ms).get(name, 0.0)
             for _, ms, _ in rows.values()]
    print(f'| {name} | ' + ' | '.join(f'{c:.2f}' for c in cells) + ' |')
  for width, (_, ms, hlo) in rows.items() if TOP_XLA.value else ():
    print(f'\nWidth {width}: XLA\'s costliest operations, ms per step\n')
    xla = sorted((k for k in ms if k.startswith(_XLA_PREFIX)), key=lambda k: -ms[k])
    for name in xla[:TOP_XLA.value]:
      instruction = name[len(_XLA_PREFIX):]
      print(f'- {ms[name]:.3f} {instruction}: {_what_it_does(hlo, instruction)}')

if __name__ == '__main__':
  try:
    app.run(main)
  finally:   # the dumps and traces of every width: tens of MB
    shutil.rmtree(_DUMP, ignore_errors=True)
