r"""What a verify call costs against a decode step, with the head as a matmul and as a reduction.

A target call over n + 1 positions (a verify call over n drafts) on the
embedded Gemma 3 270M, float32, timed as the adaptive draft length times it
(`step_costs.seconds_per_call`: a jitted loop of calls, every logit consumed,
best of a few), with the tied 262,144 x 640 head computed two ways in the same
run, the two interleaved so that a machine's drift hits both:

  matmul   XLA's general matmul, W[V, D] @ x[N, D]^T (`gemma.linear`);
  reduce   the model's CPU head for 2 to 64 rows (`gemma.head_logits`): an
           elementwise product reduced over D, one fused pass over the table.

Prints, with the CPU model and flags, milliseconds per call and the ratio to a
one-position decode step (which both forms run as a matrix-vector product).
On a 2-core AVX-512 EPYC (2 December 2026) 5 positions at batch 1 cost 1.75
decode steps as a matmul and 1.67 as a reduction (an earlier, unpolished run of
the same comparison: 1.86 and 1.62); batch 16 at 5 positions is 80 rows, past
the reduction's limit, so both forms run the matmul there.

  .venv/bin/python benchmarks/verify_cost.py [--widths=1,3,5,9] [--batches=1,4] [--rounds=3]
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
import jax

from specjax import checkpoints
from specjax.decoding import step_costs
from specjax.models import gemma
from specjax.models.language_model import LanguageModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

WIDTHS = flags.DEFINE_list('widths', ['1', '3', '5', '9'], 'Positions per row in a call.')
BATCHES = flags.DEFINE_list('batches', ['1', '4'], 'Batch sizes.')
SLOTS = flags.DEFINE_integer('num_slots', 512, 'KV cache slots.')
ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds; each figure is the best.')

# The head's form, as gemma.head_logits picks it: the row limit of the reduction.
FORMS = {'matmul': 0, 'reduce': gemma._CPU_HEAD_REDUCE_MAX_ROWS}  # pylint: disable=protected-access


def main(argv):
  del argv
  print(cpu_info.describe())
  print(f'jax {jax.__version__}, backend {jax.default_backend()}; Gemma 3 270M float32, '
        f'{SLOTS.value} cache slots')
  config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  model, params = LanguageModel(config), jax.device_put(params)
  widths = [int(w) for w in WIDTHS.value]
  batches = [int(b) for b in BATCHES.value]
  best = {}
  for round_index in range(ROUNDS.value):
    for form, max_rows in FORMS.items():
      gemma._CPU_HEAD_REDUCE_MAX_ROWS = max_rows  # pylint: disable=protected-access
      jax.clear_caches()   # the head's form is read when a program is traced
      for batch in batches:
        for width in widths:
          seconds = step_costs.seconds_per_call(model, params, width, batch=batch,
                                                num_slots=SLOTS.value)
          key = (batch, width, form)
          best[key] = min(best.get(key, float('inf')), seconds)
    print(f'round {round_index + 1} of {ROUNDS.value} done', flush=True)
  gemma._CPU_HEAD_REDUCE_MAX_ROWS = FORMS['reduce']  # pylint: disable=protected-access
  print('\n| batch | positions | matmul ms | / decode | reduce ms | / decode | reduce / matmul |')
  print('|---|---|---|---|---|---|---|')
  for batch in batches:
    decode = min(best[(batch, 1, form)] for form in FORMS)
    for width in widths:
      mat, red = best[(batch, width, 'matmul')], best[(batch, width, 'reduce')]
      print(f'| {batch} | {width} | {mat * 1e3:.1f} | {mat / decode:.2f} | {red * 1e3:.1f} | '
            f'{red / decode:.2f} | {red / mat:.2f} |')


if __name__ == '__main__':
  app.run(main)
