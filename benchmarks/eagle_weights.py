r"""The EAGLE drafter served in float32 against its int8 form, interleaved.

`eagle.weights='int8'` rounds the draft layer's matrices to int8 blocks so the CPU
kernel reads a quarter of the bytes (`eagle_net.with_int8_form`). Drafting at
batch 1 is bound by those reads: the layer runs once per draft and once more after
every target call (its update). This times, on the first prompt of each of the
first `--tasks` raw-text Spec-Bench tasks, each taking turns over `--repeats`
rounds, autoregressive decoding and, for each form of the shipped drafter, the
speculative loop with a chain of 4 drafts every step and with a policy that
never drafts (the update alone), and prints each over autoregressive decoding
(median and fastest round) with the drafts each form had accepted, and the CPU
model and flags. Greedy outputs are checked identical to autoregressive decoding's.

  .venv/bin/python benchmarks/eagle_weights.py --tasks=8 --repeats=5
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
import jax

from specjax.decoding import autoregressive, draft_length, speculative
from specjax.drafters import make_drafter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import served  # noqa: E402  pylint: disable=g-import-not-at-top

PROMPTS = flags.DEFINE_string('prompts', served.SPEC_BENCH, 'Spec-Bench question.jsonl.')
TASKS = flags.DEFINE_integer('tasks', 8, 'The first prompt of each of this many tasks.')
MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Tokens generated per prompt.')
REPEATS = flags.DEFINE_integer('repeats', 5, 'Interleaved timed rounds (after a first).')

GAMMA = 4
# Drafting priced out: every step is plain, and the loop pays the drafter's update alone.
NEVER_DRAFTS = draft_length.Policy(buckets=(0, 2, 4), costs=(1.0, 50.0, 60.0))


def main(argv):
  del argv
  chosen, model, params, ids = served.start(PROMPTS.value, TASKS.value)
  trained = served.shipped_eagle(model)

  def over_prompts(run):
    outs = [run(one) for one in ids]
    return (sum(o.wall_s for o in outs), [o.new_tokens[0] for o in outs],
            sum(sum(getattr(o, 'accepted_tokens', [0])) for o in outs))

  runs = {'autoregressive': lambda: over_prompts(
      lambda one: autoregressive.generate(model, params, one, max_new_tokens=MAX_NEW.value))}
  for weights in ('float32', 'int8'):
    drafter = make_drafter('eagle', target=model, trained=trained, target_params=params,
                           settings={'weights': weights})
    for label, policy in (('chain of 4', draft_length.fixed(GAMMA)), ('never drafts', NEVER_DRAFTS)):
      runs[f'{weights}, {label}'] = lambda drafter=drafter, policy=policy: over_prompts(
          lambda one: speculative.generate(model, params, drafter, one, gamma=GAMMA,
                                           max_new_tokens=MAX_NEW.value, policy=policy))
  first, seconds = served.interleaved(runs, REPEATS.value)
  print(f'jax {jax.__version__}, Gemma 3 270M float32, the shipped EAGLE drafter, greedy, '
        f'{len(ids)} prompts ({", ".join(p.category for p in chosen)}), {MAX_NEW.value} new tokens, '
        f'{REPEATS.value} interleaved rounds\n')
  print('| run | accepted drafts | time over autoregressive, median | fastest | speedup, median |')
  print('|---|---|---|---|---|')
  for name in runs:
    ratio, fastest = served.over_autoregressive(seconds, name)
    print(f'| {name} | {first[name][2]} | {ratio:.3f} | {fastest:.3f} | {1 / ratio:.2f}x |')


if __name__ == '__main__':
  app.run(main)
