r"""What a step of each width costs inside the speculative loop, against what the policy is told.

The adaptive draft length weighs each width by `step_costs.measure`: a bare
target call over n + 1 positions, timed alone. Inside the loop a step also
drafts, chooses, accepts, commits and updates the drafter. If those cost
much, the policy takes calls that do not pay. This benchmark measures the
step as the loop runs it, width by width:

  - the policy is forced to one width for every step (costs that make every
    other width lose), with the `ngram` drafter on real prompts;
  - each program runs for 16 and for 64 new tokens; the difference of the two
    times over the difference of their steps is a step's cost without the
    prefill;
  - autoregressive decoding is timed the same way, and the programs take turns
    over `--repeats` rounds, each keeping its fastest.

Prints, with the CPU model and flags, per batch size: milliseconds per step
for autoregressive decoding and for the loop at each width, the loop's step
over the autoregressive one, and the bare call's cost as the policy measures
it. The loop's width-0 step is a plain decode step inside the speculative
loop; its ratio is what a batch that never drafts pays over plain decoding.

On the 2-core AVX-512 EPYC of 5 December 2026, batch 4, 128 slots: the loop's
step over 3 positions cost 1.74 autoregressive steps with `jnp.argmax` as
the greedy rule's argmax and 1.54 with the chunked one (`specjax/argmax.py`),
against 1.45-1.58 for the bare call: the argmax over 12 rows of 262,144
logits took 7 ms of the 86 ms step.

  .venv/bin/python benchmarks/loop_costs.py --batch_sizes=1,4,8
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
import jax

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

PROMPTS = flags.DEFINE_string('prompts', _SPEC_BENCH,
                              'Spec-Bench question.jsonl ("": the built-in completion prompts).')
BATCH_SIZES = flags.DEFINE_list('batch_sizes', ['1', '4', '8'], 'Batch sizes.')
SLOTS = flags.DEFINE_integer('slots', 128, 'KV cache slots per row.')
WIDTHS = flags.DEFINE_list('widths', ['0', '2', '4'], 'Drafts verified per step (0: plain).')
REPEATS = flags.DEFINE_integer('repeats', 3, 'Rounds; every program runs once per round.')
SHORT, LONG = 16, 64


def _prompts(tokenizer, batch: int, slots: int) -> list[list[int]]:
  """The first `batch` prompts, cut so that prompt and tokens fit the slots."""
  loaded = prompts_lib.load_prompts(PROMPTS.value if os.path.exists(PROMPTS.value) else '')
  keep = slots - LONG - max(int(w) for w in WIDTHS.value) - 2
  ids = [tokenizer.encode(p.text, add_bos=True)[:keep] for p in loaded]
  return [ids[i % len(ids)] for i in range(batch)]


def _forced(widths: tuple[int, ...], width: int) -> draft_length.Policy:
  """A policy that takes `width` at every step: every other width costs 100 steps."""
  return draft_length.Policy(widths, tuple(0.01 if w == width else 100.0 for w in widths))


def measure(model, params, tokenizer, batch: int) -> dict:
  widths = tuple(sorted({0, *(int(w) for w in WIDTHS.value)}))
  gamma = max(widths)
  ngram = make_drafter('ngram', target=model)
  prompts = _prompts(tokenizer, batch, SLOTS.value)
  packs = {n: program.pack(model, prompts, max_new_tokens=n, extra_slots=gamma + 1,
                           max_cache_len=SLOTS.value) for n in (SHORT, LONG)}
  calls = {}
  for n in (SHORT, LONG):
    calls['autoregressive', n] = (lambda n=n: autoregressive.generate(
        model, params, packs[n], max_new_tokens=n))
    for w in widths:
      calls[w, n] = (lambda n=n, w=w: speculative.generate(
          model, params, ngram, packs[n], gamma=gamma, max_new_tokens=n,
          policy=_forced(widths, w)))
  for call in calls.values():   # compile and warm up
    call()
  best, steps = {k: float('inf') for k in calls}, {}
  for _ in range(max(1, REPEATS.value)):
    for key, call in calls.items():
      out = call()
      best[key] = min(best[key], out.wall_s)
      steps[key] = out.steps
  per_step = {m: (best[m, LONG] - best[m, SHORT]) / (steps[m, LONG] - steps[m, SHORT])
              for m in ['autoregressive', *widths]}
  bare = step_costs.measure(model, params, widths, batch=batch, num_slots=SLOTS.value)
  return dict(per_step=per_step, bare=dict(zip(widths, bare)), widths=widths)


def main(argv):
  del argv
  compile_cache.enable()
  config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  model = LanguageModel(config)
  params = jax.device_put(q8_weights.with_q8_weights(params))  # the head as the product serves it
  tokenizer = Tokenizer.from_gguf(embedded.default_gguf_path())
  lines = [cpu_info.describe(), f'jax {jax.__version__}, float32, greedy, {SLOTS.value} slots, '
           f'step = (time for {LONG} tokens - time for {SHORT}) / (steps - steps), fastest of '
           f'{REPEATS.value} rounds', '',
           '| batch | autoregressive ms | width | loop step ms | loop / autoregressive | '
           'bare call (policy\'s cost) |', '|---|---|---|---|---|---|']
  for batch in (int(b) for b in BATCH_SIZES.value):
    got = measure(model, params, tokenizer, batch)
    ar = got['per_step']['autoregressive']
    for w in got['widths']:
      ms = got['per_step'][w]
      lines.append(f'| {batch} | {1e3 * ar:.1f} | {w} | {1e3 * ms:.1f} | {ms / ar:.3f} | '
                   f'{got["bare"][w]:.2f} |')
    print('\n'.join(lines[-len(got['widths']):]), flush=True)
  print('\n'.join(lines))


if __name__ == '__main__':
  app.run(main)
