"""Reduced draft vocabularies and training-free self-speculation, measured in one run.

Gemma 3 270M (the embedded GGUF, float32), greedy, raw-text Spec-Bench prompts
(`--per_category` per task, first turn, no chat template). Prints, with the
CPU model and flags:

  1. the cost of one draft step (batch 1, one token over a cache) of
     `early_exit` (`--layers` layers) with the full head and with reduced heads
     of N = 8k/16k/32k/64k (their rows of the table in float32, and from the
     table's int8 form, as the drafters read them where the target has one),
     of `layer_skip` (the shipped searched set) with a 32k head, and of the
     shipped EAGLE head (its 16k rows in float32 and from int8; a draft of a
     4-draft chain, on average), each over a target decode step; every step's
     logits are consumed (argmax), else XLA would slice the head's work away;
  2. coverage: the share of the target's greedy output tokens on these prompts
     (held out: the vocabulary was counted on specjax/prompts/calibration.jsonl)
     inside each reduced vocabulary;
  3. mean accepted tokens per target call (new tokens / target calls) and the
     acceptance rate for each self-drafter (`early_exit`, and `layer_skip`
     with the shipped set and with one layer skipped) with the full head and
     every reduced vocabulary, gamma `--gamma` fixed, all prompts in one batch
     (greedy with a fixed draft length: a row's counts do not depend on its
     batch), outputs checked identical to plain decoding;
  4. batch 1, Spec-Bench's way: per task, speedup = mean tokens/s of a drafter
     (adaptive draft length, measured verify costs) over autoregressive tokens/s
     on the same prompts, and overall.

Only ratios within this run mean anything: the machine may be shared.
Compilation is excluded (each program runs once untimed first).

  .venv/bin/python benchmarks/draft_heads.py --per_category=2 --max_new_tokens=128

`--sections=costs,coverage,acceptance` leaves out the slowest, the batch-1
speed section; `--sections=costs` prints the draft-step costs alone (the
draft cost c of the paper tables' predictions) and stops before any generation.
"""

from __future__ import annotations

import collections
import os
import sys
import time
import zlib

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specjax import checkpoints
from specjax import compile_cache
from specjax.checkpoints import embedded
from specjax.decoding import autoregressive, draft_length, program, speculative, step_costs
from specjax.drafters import draft_vocab, layer_skip, make_drafter
from specjax.experiments import prompts as prompts_lib
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from specjax.tokenizer import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

_HERE = os.path.dirname(os.path.abspath(__file__))
_SPEC_BENCH = os.path.join(_HERE, '..', '..', 'shared', 'data', 'spec_bench_question.jsonl')

PROMPTS = flags.DEFINE_string('prompts', _SPEC_BENCH, 'Spec-Bench question.jsonl.')
PER_CATEGORY = flags.DEFINE_integer('per_category', 2, 'Prompts per Spec-Bench task.')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 128, 'Tokens generated per prompt.')
LAYERS = flags.DEFINE_integer('layers', 4, "early_exit's layers.")
GAMMA = flags.DEFINE_integer('gamma', 4, 'Draft length (fixed in section 3, the most in 4).')
SIZES = flags.DEFINE_list('sizes', ['8192', '16384', '32768', '65536'], 'Reduced vocabularies.')
SPEED = flags.DEFINE_list('speed', ['layer_skip', 'early_exit'],
                          'Drafters (32k head) of the batch-1 speed section.')
SECTIONS = flags.DEFINE_list('sections', ['costs', 'coverage', 'acceptance', 'speed'],
                             'Which of the four tables to print.')
SLOTS = 512   # cache slots of the step-cost section


def drafter_settings(name: str, size: int) -> dict:
  vocab = dict(draft_vocab='embedded' if size else '', draft_vocab_size=size)
  if name == 'early_exit':
    return dict(layers=LAYERS.value, **vocab)
  return dict(**vocab)   # layer_skip: the shipped searched set


def timed(fn, *args, reps: int = 20) -> float:
  """Median seconds of fn(*args) (compiled first)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def step_cost_table(model, params, vocab, skip) -> str:
  cache = model.init_cache(1, SLOTS)
  token, pos = jnp.asarray([[17]], jnp.int32), jnp.asarray([[300]], jnp.int32)

  @jax.jit
  def target_step(params, cache):
    return jnp.argmax(model.forward(params, token, pos, cache).logits_BxRxV, -1)

  def draft_step(num_layers, skip_layers, head, head_q8=None):
    @jax.jit
    def step(params, head_NxD, head_q8, cache):
      out = model.forward(params, token, pos, cache, num_layers=num_layers,
                          skip_layers=skip_layers, logits=head_NxD is None)
      if head_NxD is None:
        return jnp.argmax(out.logits_BxRxV, -1)
      return jnp.argmax(draft_vocab.head_logits(head_NxD, out.hidden_BxTxD[:, 0], model.config,
                                                head_q8), -1)
    return lambda: step(params, head, head_q8, cache)

  base = timed(target_step, params, cache)
  rows = [('target decode step (18 layers, 262k head)', base)]
  rows.append((f'early_exit {LAYERS.value} layers, full head',
               timed(draft_step(LAYERS.value, (), None))))
  heads = {}
  for size in (int(s) for s in SIZES.value):
    heads[size] = draft_vocab.reduced_head(params['embedding_VxD'], vocab.first(size).ids_N)
    rows.append((f'early_exit {LAYERS.value} layers, {size // 1024}k head',
                 timed(draft_step(LAYERS.value, (), heads[size]))))
    form = draft_vocab.head_form(params, vocab.first(size).ids_N)
    if form is not None:
      rows.append((f'early_exit {LAYERS.value} layers, {size // 1024}k head from int8',
                   timed(draft_step(LAYERS.value, (), heads[size], form))))
  rows.append((f'layer_skip skip={list(skip)}, 32k head',
               timed(draft_step(None, tuple(skip), heads.get(32768),
                                draft_vocab.head_form(params, vocab.first(32768).ids_N)))))
  rows += eagle_rows(model, params)
  lines = [f'Draft step cost over a target decode step (batch 1, {SLOTS} cache slots, '
           'logits consumed by argmax):', '', '| step | ms | / target step |', '|---|---|---|']
  lines += [f'| {name} | {1e3 * s:.1f} | {s / base:.3f} |' for name, s in rows]
  return '\n'.join(lines)


def eagle_rows(model, params) -> list[tuple[str, float]]:
  """A draft of the shipped EAGLE head (a 4-draft chain's mean), its head rows in float32
  and, where the target has the table's int8 form, from that."""
  from specjax.checkpoints import drafter_io  # pylint: disable=g-import-not-at-top
  signature = drafter_io.target_signature(model.config,
                                          checkpoints.content_digest('embedded:gemma3-270m'))
  trained = drafter_io.load_drafter('embedded', 'eagle', target=signature)
  plain = {k: v for k, v in params.items()
           if k not in (q8_weights.HEAD_FORM, q8_weights.HEAD_SCALE)}
  rows = []
  for label, target_params in (('float32', plain), ('int8', params)):
    if label == 'int8' and q8_weights.HEAD_FORM not in params:
      continue
    drafter = make_drafter('eagle', target=model, trained=trained, target_params=target_params)
    seconds = step_costs.seconds_per_draft(drafter, model, params, 4, batch=1, num_slots=SLOTS)
    rows.append((f'eagle (shipped), 16k head rows in {label}, one draft of 4', seconds / 4))
  return rows


def main(argv):
  del argv
  compile_cache.enable()
  start = time.time()
  print(cpu_info.describe())
  print('Note: the 2-core machine is shared with other agents; only ratios within this run count.')
  config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  model = LanguageModel(config)
  params = jax.device_put(q8_weights.with_q8_weights(params))  # the head as the product serves it
  tokenizer = Tokenizer.from_gguf(embedded.default_gguf_path())
  vocab = draft_vocab.load(draft_vocab.EMBEDDED_FILE)
  skip = layer_skip.searched()['skip']
  eos = (tokenizer.eos_id,)

  by_task = collections.defaultdict(list)
  for p in prompts_lib.load_prompts(PROMPTS.value):
    by_task[p.category].append(p)
  chosen = [p for task in by_task.values() for p in task[:PER_CATEGORY.value]]
  ids = [tokenizer.encode(p.text, add_bos=True) for p in chosen]   # raw text
  row_ids = [zlib.crc32(p.id.encode()) for p in chosen]
  print(f'jax {jax.__version__}; {len(chosen)} Spec-Bench prompts, {MAX_NEW.value} new tokens; '
        f'gamma {GAMMA.value}; layer_skip set {skip} (shipped search result)\n')

  if 'costs' in SECTIONS.value:
    print(step_cost_table(model, params, vocab, skip), '\n', flush=True)
  if SECTIONS.value == ['costs']:   # the other sections start from the autoregressive outputs
    print(f'{time.time() - start:.0f} s in all')
    return

  # Batch 1, autoregressive: the baseline, and the held-out text for coverage.
  compiled = set()

  def run(call, packed):
    if packed.bucket not in compiled:
      call()   # compile, untimed
    return call()

  ar = []
  for prompt, rid in zip(ids, row_ids):
    packed = program.pack(model, [prompt], max_new_tokens=MAX_NEW.value,
                          extra_slots=GAMMA.value + 1, row_ids=[rid])
    ar.append(run(lambda: autoregressive.generate(model, params, packed,  # noqa: B023
                                                  max_new_tokens=MAX_NEW.value, eos_ids=eos),
                  packed))
    compiled.add(packed.bucket)
  outputs = [g.new_tokens[0] for g in ar]
  lines = ['Coverage: share of the target\'s greedy output tokens on these Spec-Bench prompts '
           'inside the reduced vocabulary (all prompts; the lowest task):', '',
           '| N | coverage | lowest task |', '|---|---|---|']
  for size in (int(s) for s in SIZES.value) if 'coverage' in SECTIONS.value else ():
    sub = vocab.first(size)
    per_task = collections.defaultdict(list)
    for p, out in zip(chosen, outputs):
      per_task[p.category] += out
    low = min(per_task, key=lambda t: sub.coverage(per_task[t]))
    lines.append(f'| {size} | {sub.coverage([t for o in outputs for t in o]):.4f} | '
                 f'{low} {sub.coverage(per_task[low]):.4f} |')
  if 'coverage' in SECTIONS.value:
    print('\n'.join(lines), '\n', flush=True)

  # Mean accepted tokens, all prompts in one batch, fixed gamma.
  lines = [f'Mean accepted tokens per target call (gamma {GAMMA.value} fixed, all prompts in one '
           'batch; plain decoding = 1.00):', '',
           '| drafter | head | mean accepted | acceptance rate | identical to plain |',
           '|---|---|---|---|---|']
  sizes = [0] + [int(s) for s in SIZES.value]   # 0: the full head
  configs = ([('early_exit', size, {}) for size in sizes]
             + [('layer_skip', size, {}) for size in sizes]
             + [('layer_skip', 32768, dict(skip=(4,)))])
  for name, size, extra in configs if 'acceptance' in SECTIONS.value else ():
    drafter = make_drafter(name, target=model, settings=dict(drafter_settings(name, size),
                                                             **extra),
                           target_params=params)
    out = speculative.generate(model, params, drafter, ids, gamma=GAMMA.value,
                               max_new_tokens=MAX_NEW.value, eos_ids=eos, row_ids=row_ids,
                               policy=draft_length.fixed(GAMMA.value))
    mean_acc = sum(len(t) for t in out.new_tokens) / sum(out.target_calls)
    rate = sum(out.accepted_tokens) / max(1, sum(out.drafted_tokens))
    same = np.mean([a == b for a, b in zip(out.new_tokens, outputs)])
    label = name + (f' skip={list(extra["skip"])}' if extra else '')
    lines.append(f'| {label} | {f"{size // 1024}k" if size else "full"} | {mean_acc:.2f} | '
                 f'{rate:.3f} | {same:.2f} |')
    print(lines[-1], flush=True)
  if 'acceptance' in SECTIONS.value:
    print('\n'.join(lines), '\n', flush=True)

  # Batch 1 speed, adaptive draft length with measured step costs (drafting included).
  costs = {}

  def policy(drafter, packed):
    key = (drafter.name, packed.num_slots)
    if key not in costs:
      buckets = draft_length.default_buckets(GAMMA.value)
      costs[key] = (buckets, step_costs.measure(model, params, buckets, batch=1,
                                                num_slots=packed.num_slots, drafter=drafter))
    buckets, c = costs[key]
    return speculative.make_policy(GAMMA.value, 1, buckets=buckets, costs=c)

  base_tps = collections.defaultdict(list)
  for p, g in zip(chosen, ar):
    base_tps[p.category].append(len(g.new_tokens[0]) / g.wall_s)
  tasks = sorted(base_tps)
  lines = ['Batch 1 speedup over autoregressive (mean tokens/s ratio per task; adaptive draft '
           f'length up to gamma {GAMMA.value}; 32k head):', '',
           '| drafter | ' + ' | '.join(tasks) + ' | overall | identical |',
           '|---|' + '---|' * (len(tasks) + 2)]
  for name in SPEED.value if 'speed' in SECTIONS.value else ():
    drafter = make_drafter(name, target=model, settings=drafter_settings(name, 32768),
                           target_params=params)
    done, tps, same = set(), collections.defaultdict(list), []
    for p, prompt, rid, base in zip(chosen, ids, row_ids, outputs):
      packed = program.pack(model, [prompt], max_new_tokens=MAX_NEW.value,
                            extra_slots=GAMMA.value + 1, row_ids=[rid])
      pol = policy(drafter, packed)
      call = lambda: speculative.generate(model, params, drafter, packed,  # noqa: E731,B023
                                          gamma=GAMMA.value, max_new_tokens=MAX_NEW.value,
                                          eos_ids=eos, policy=pol)  # noqa: B023
      if packed.bucket not in done:
        call()
        done.add(packed.bucket)
      out = call()
      tps[p.category].append(len(out.new_tokens[0]) / out.wall_s)
      same.append(out.new_tokens[0] == base)
    cells = [np.mean(tps[t]) / np.mean(base_tps[t]) for t in tasks]
    overall = (np.mean([x for t in tasks for x in tps[t]])
               / np.mean([x for t in tasks for x in base_tps[t]]))
    lines.append(f'| {name} | ' + ' | '.join(f'{c:.2f}x' for c in cells)
                 + f' | {overall:.2f}x | {np.mean(same):.2f} |')
    print(lines[-1], flush=True)
  if 'speed' in SECTIONS.value:
    print('\n'.join(lines))
  print(f'\n{time.time() - start:.0f} s in all')


if __name__ == '__main__':
  app.run(main)
