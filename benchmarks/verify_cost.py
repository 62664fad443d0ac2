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

Then what the CPU allows: each extra position costs 2 FLOP per matmul
parameter (0.54 GFLOP on the 270M), which on two cores is not free. The
machine's matmul speed is measured on the head at 64 rows, where it is
compute-bound, and the last column gives the call's cost if every extra FLOP
ran at that speed after the step's weight reads (no overlap):
1 + (n - 1) * F / (speed * decode time). A kernel that overlapped the two
perfectly could go lower; XLA runs each dot as its own kernel, so only the
head's can. On the AVX-512 EPYC of 3 December 2026 (165 GFLOP/s, a 48 ms
step) that was 1.27 decode steps at 5 positions and 1.54 at 9, against 1.83
and 2.61 measured (the matmul head: 1.86 and 2.32): the extra positions ran
at about a third of the speed the CPU reaches on 64 rows.

  .venv/bin/python benchmarks/verify_cost.py [--widths=1,3,5,9] [--batches=1,4] [--rounds=3]
  (that run: --widths=1,5,9 --batches=1 --rounds=2)
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from specjax import checkpoints
from specjax.decoding import step_costs
from specjax.models import gemma
from specjax.models.language_model import LanguageModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import timing  # noqa: E402  pylint: disable=g-import-not-at-top

WIDTHS = flags.DEFINE_list('widths', ['1', '3', '5', '9'], 'Positions per row in a call.')
BATCHES = flags.DEFINE_list('batches', ['1', '4'], 'Batch sizes.')
SLOTS = flags.DEFINE_integer('num_slots', 512, 'KV cache slots.')
ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds; each figure is the best.')

# The head's form, as gemma.head_logits picks it: the row limit of the reduction.
FORMS = {'matmul': 0, 'reduce': gemma._CPU_HEAD_REDUCE_MAX_ROWS}  # pylint: disable=protected-access


_PEAK_ROWS = 64


def matmul_params(params) -> int:
  """Parameters a position multiplies: every matrix, the tied table once (as the head)."""
  return sum(x.size for x in jax.tree.leaves(params) if x.ndim == 2)


def matmul_gflops(table_VxD) -> float:
  """The CPU's float32 matmul speed, on the head at 64 rows (compute-bound there)."""
  x_1xNxD = jnp.ones((1, _PEAK_ROWS, table_VxD.shape[1]), jnp.float32)
  head = jax.jit(lambda x, w: gemma.linear(x, w).max())
  return 2 * _PEAK_ROWS * table_VxD.size / timing.best_seconds(head, x_1xNxD, table_VxD) / 1e9


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
  flop_per_position = 2 * matmul_params(params)
  gflops = matmul_gflops(params['embedding_VxD'])
  print(f'\nmatmul speed (the head at {_PEAK_ROWS} rows): {gflops:.0f} GFLOP/s; '
        f'{flop_per_position / 1e9:.2f} GFLOP per position')
  print('\n| batch | positions | matmul ms | / decode | reduce ms | / decode | reduce / matmul '
        '| at peak, no overlap |')
  print('|---|---|---|---|---|---|---|---|')
  for batch in batches:
    decode = min(best[(batch, 1, form)] for form in FORMS)
    for width in widths:
      mat, red = best[(batch, width, 'matmul')], best[(batch, width, 'reduce')]
      extra_seconds = batch * (width - 1) * flop_per_position / (gflops * 1e9)
      print(f'| {batch} | {width} | {mat * 1e3:.1f} | {mat / decode:.2f} | {red * 1e3:.1f} | '
            f'{red / decode:.2f} | {red / mat:.2f} | {1 + extra_seconds / decode:.2f} |')


if __name__ == '__main__':
  app.run(main)
