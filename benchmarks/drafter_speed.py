r"""Drafters' speed over autoregressive decoding, interleaved, on the loop's default policy.

A sweep times its cells one after another, so a cell's ratio moves with the
machine's spells (about 0.07 between whole Spec-Bench sweeps on a shared 2-core
VM); a change to a drafter's cost of a few percent does not show there. This
times, in turns over `--repeats` rounds, autoregressive decoding and each
drafter's loop on the same prompts (the first prompt of `--tasks` Spec-Bench
tasks, raw text, batch 1, greedy), under the adaptive policy as a run builds
it (costs measured on this machine for each prompt's cache length, drafting
included for a costly drafter, `step_costs.measure_parts`) and, with
`--never_drafts`, with drafting priced out (every step plain: what the
drafter costs the loop when it drafts nothing). Outputs are checked identical;
prints the median and fastest time over autoregressive decoding's, the speedup,
and tokens per target call, with the CPU model and flags; `--per_task` adds each
task's speedup and tokens per call. To compare two
versions of the code, run it in each (a `git worktree` of the other commit):
the ratios are against the baseline of the same run.

  .venv/bin/python benchmarks/drafter_speed.py --drafters=ngram,eagle,hybrid --never_drafts
  .venv/bin/python benchmarks/drafter_speed.py --drafters=ngram,hybrid --unplanned --repeats=7
  .venv/bin/python benchmarks/drafter_speed.py --tasks=13 --drafters=ngram,hybrid --per_task
  .venv/bin/python benchmarks/drafter_speed.py --drafters=eagle,hybrid \
      --eagle_checkpoints=embedded,results/train_eagle-instructions/drafter
"""

from __future__ import annotations

import dataclasses
import os
import sys

from absl import app
from absl import flags
import jax
import numpy as np

from specjax.decoding import autoregressive, draft_length, program, speculative, step_costs
from specjax.drafters import eagle
from specjax.drafters import make_drafter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import served  # noqa: E402  pylint: disable=g-import-not-at-top

PROMPTS = flags.DEFINE_string('prompts', served.SPEC_BENCH, 'Spec-Bench question.jsonl.')
TASKS = flags.DEFINE_integer('tasks', 8, 'The first prompt of each of this many tasks.')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Tokens generated per prompt.')
REPEATS = flags.DEFINE_integer('repeats', 5, 'Interleaved timed rounds (after a first).')
GAMMA = flags.DEFINE_integer('gamma', 4, 'The most drafts per call.')
DRAFTERS = flags.DEFINE_list('drafters', ['ngram', 'eagle', 'hybrid'],
                             'ngram, eagle, hybrid (n-gram lookup over the shipped EAGLE).')
NEVER_DRAFTS = flags.DEFINE_bool('never_drafts', False,
                                 'Also time each drafter with drafting priced out.')
DRAFT_VOCAB_SIZES = flags.DEFINE_list('draft_vocab_sizes', [str(eagle.Settings.draft_vocab_size)],
                                      "eagle.draft_vocab_size values to time EAGLE and the hybrid "
                                      "with (default: the product's; 0: the drafter's whole draft "
                                      "vocabulary).")
CHECKPOINTS = flags.DEFINE_list('eagle_checkpoints', ['embedded'],
                                "EAGLE drafters to time side by side ('embedded': the shipped one, "
                                'or a directory python -m specjax.train wrote).')
PER_TASK = flags.DEFINE_bool('per_task', False,
                             'Also print each task\'s speedup and tokens per call.')
UNPLANNED = flags.DEFINE_bool('unplanned', False,
                              'Also time the hybrid without its plan, as before 7 December 2026: '
                              'one history for both sources and every step priced without the '
                              "network's drafting.")



def _drafters(name, model, params):
  """(label, drafter) of `name`, one per draft vocabulary size for EAGLE and the hybrid."""
  if name == 'ngram':
    return [('ngram', make_drafter('ngram', target=model))]
  if name not in ('eagle', 'hybrid'):
    sys.exit(f'unknown drafter {name!r}: one of ngram, eagle, hybrid')
  out = []
  for checkpoint in CHECKPOINTS.value:
    trained = served.shipped_eagle(model, checkpoint)
    for size in (int(n) for n in DRAFT_VOCAB_SIZES.value):
      eagle_settings = {'draft_vocab_size': size}
      drafter = (make_drafter('eagle', target=model, trained=trained, target_params=params,
                              settings=eagle_settings) if name == 'eagle' else
                 make_drafter('hybrid', target=model, trained=trained, target_params=params,
                              fallback_settings=eagle_settings))
      notes = ([] if size == eagle.Settings.draft_vocab_size else
               [f'draft vocab {size or "all"}']) + (
                   [] if checkpoint == 'embedded' else [os.path.basename(
                       os.path.dirname(os.path.abspath(checkpoint)))])
      out.append((name + (f' ({", ".join(notes)})' if notes else ''), drafter))
  return out


def main(argv):
  del argv
  chosen, model, params, ids = served.start(PROMPTS.value, TASKS.value)

  gamma = GAMMA.value
  packed = [program.pack(model, one, max_new_tokens=MAX_NEW.value, extra_slots=gamma + 1)
            for one in ids]
  buckets = draft_length.default_buckets(gamma)
  measured = {}

  def measured_policy(label, drafter, slots, drafting_known=True):
    """The policy a run builds for this cache length (`experiments/methods._policy`);
    without `drafting_known`, every step priced without the drafting part."""
    if (label, slots) not in measured:
      costs, draft_costs = step_costs.measure_parts(model, params, buckets, batch=1,
                                                    num_slots=slots, drafter=drafter)
      print(f'{label}, {slots} slots: costs {", ".join(f"{c:.2f}" for c in costs)} '
            f'(drafting {", ".join(f"{c:.2f}" for c in draft_costs)})')
      measured[label, slots] = costs, draft_costs
    costs, draft_costs = measured[label, slots]
    if not drafting_known:
      costs, draft_costs = tuple(c - d for c, d in zip(costs, draft_costs)), ()
    return speculative.make_policy(gamma, 1, buckets=buckets, costs=costs,
                                   draft_costs=draft_costs)

  def over_prompts(run):
    """(seconds per prompt, outputs, target calls per prompt), the prompts in turn."""
    outs = [run(i) for i in range(len(ids))]
    return (np.array([o.wall_s for o in outs]), [o.new_tokens[0] for o in outs],
            [sum(getattr(o, 'target_calls', [0])) for o in outs])

  def speculative_run(drafter, policies):
    return lambda: over_prompts(lambda i: speculative.generate(
        model, params, drafter, packed[i], gamma=gamma, max_new_tokens=MAX_NEW.value,
        policy=policies[i]))

  runs = {'autoregressive': lambda: over_prompts(lambda i: autoregressive.generate(
      model, params, packed[i], max_new_tokens=MAX_NEW.value))}
  for label, drafter in [d for name in DRAFTERS.value for d in _drafters(name, model, params)]:
    runs[label] = speculative_run(drafter, [measured_policy(label, drafter, p.tokens_BxS.shape[1])
                                            for p in packed])
    if drafter.name == 'hybrid' and UNPLANNED.value:
      runs[label + ', unplanned'] = speculative_run(
          dataclasses.replace(drafter, plan=None),
          [measured_policy(label, drafter, p.tokens_BxS.shape[1], drafting_known=False)
           for p in packed])
    if NEVER_DRAFTS.value:
      runs[label + ', never drafts'] = speculative_run(drafter, [served.PRICED_OUT] * len(packed))
  # The cost-measuring programs are not needed again; every compiled program stays mapped
  # in memory, and with them 13 tasks x 7 drafters ran past the kernel's limit of memory
  # maps (LLVM: 'Cannot allocate memory').
  jax.clear_caches()
  first, seconds_P = served.interleaved(runs, REPEATS.value)
  seconds = {name: [float(s.sum()) for s in rounds] for name, rounds in seconds_P.items()}
  new_tokens_P = [len(t) for t in first['autoregressive'][1]]
  print(f'\njax {jax.__version__}, Gemma 3 270M float32 (served with its int8 forms), greedy, '
        f'batch 1, gamma {gamma}, {len(ids)} prompts '
        f'({", ".join(p.category for p in chosen)}), {MAX_NEW.value} new tokens, '
        f'{REPEATS.value} interleaved rounds\n')
  print('| run | tokens per target call | time over autoregressive, median | fastest | '
        'speedup, median |')
  print('|---|---|---|---|---|')
  for name in runs:
    ratio, fastest = served.over_autoregressive(seconds, name)
    print(f'| {name} | {_per_call(sum(new_tokens_P), sum(first[name][2]))} | {ratio:.3f} | '
          f'{fastest:.3f} | {1 / ratio:.2f}x |')
  if PER_TASK.value:
    names = [n for n in runs if n != 'autoregressive']
    print('\nPer task: speedup (median over rounds of the prompt\'s time, against '
          'autoregressive decoding\'s), and tokens per target call\n')
    print('| task | ' + ' | '.join(names) + ' |')
    print('|---|' + '---|' * len(names))
    for i, prompt in enumerate(chosen):
      base = np.median([s[i] for s in seconds_P['autoregressive']])
      cells = [f'{base / np.median([s[i] for s in seconds_P[n]]):.2f}x '
               f'({_per_call(new_tokens_P[i], first[n][2][i])})' for n in names]
      print(f'| {prompt.category} | ' + ' | '.join(cells) + ' |')


def _per_call(new_tokens: int, calls: int) -> str:
  return f'{new_tokens / calls:.2f}' if calls else '1.00'


if __name__ == '__main__':
  app.run(main)
