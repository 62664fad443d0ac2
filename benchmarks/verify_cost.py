r"""What a verify call costs against a decode step, with XLA's kernels and with specjax's.

A target call over n + 1 positions (a verify call over n drafts) on the
embedded Gemma 3 270M, float32, timed as the adaptive draft length times it
(`step_costs.seconds_per_call`: a jitted loop of calls, every logit consumed,
best of a few), with every matrix product computed two ways in the same run,
the two interleaved so that a machine's drift hits both:

  xla      XLA:CPU's own kernels: the body's matrices through `gemma.linear`,
           the tied 262,144 x 640 head for 2 to 64 rows as an elementwise
           product reduced over D (`gemma.head_logits`), a GEMV at one row;
  kernel   specjax's skinny-matmul kernel (`cpu_kernels/skinny_matmul`) for
           every product of 2 to 15 rows (a single row stays with XLA, as
           in the product): each matrix streamed once, with the reads
           overlapped with the arithmetic; attention still XLA's.
  kernels  that, and specjax's attention kernel (`cpu_kernels/attention`):
           each slot a query may see read once, on both threads, the others
           skipped;
  q8 head  that, and the tied head from its Q8_0 form (`models/q8_weights`,
           `cpu_kernels/q8_matmul`) for 1 to 20 rows, a decode step's one
           row included: 189 MB read instead of 671;
  q8       that, and every other matrix that is exactly int8 blocks (the
           270M's Q5_0, Q8_0, Q4_K and Q6_K projections) from its int8 form
           too (what the product runs for sampled decoding: every logit);
  q8 greedy  that, for greedy decoding: each position's argmax from the
           head's argmax kernel (`cpu_kernels/q8_argmax`), no logits (what
           the product runs for greedy decoding).

The rows sit halfway through the cache (`step_costs`), so at 1,024 slots a
global layer sees about 512 of them.

Prints, with the CPU model and flags, milliseconds per call, each form's
ratio to its own one-position call, and the product's ratio to the fastest
one-position call of any form. At one position the xla and kernel forms run
the same program (a single row stays with XLA), and the kernels form differs
only in its attention, so on a noisy machine their spread is noise: on a
2-core Xeon (5 December 2026) the kernels form's own decode step measured
47.9 ms against 38.6 ms for the same step in the kernel form, which put a
9-position call at 1.35 of its own step and 1.68 of the fastest; a direct
comparison of the two decode steps, in turns, gave 49.1 against 50.0 ms.

Then what the CPU allows: each extra position costs 2 FLOP per matmul
parameter (0.54 GFLOP on the 270M), which on two cores is not free. The
machine's matmul speed is measured on the head at 64 rows, where it is
compute-bound, and the last column gives the call's cost if every extra FLOP
ran at that speed after the step's weight reads (no overlap):
1 + (n - 1) * F / (speed * decode time). A kernel that overlaps the two can go
lower, and the skinny-matmul kernel does.

On the 2-core AVX-512 EPYC of 3 December 2026 (191 GFLOP/s, a 47 ms step), at
batch 1: 5 positions cost 1.13 decode steps with the kernel and 1.69 with
XLA's, 9 positions 1.57 and 2.18, against 1.24 and 1.48 at peak without
overlap (an earlier run: 1.44 / 1.77 and 1.58 / 2.41). At batch 4 a call over
5 positions is 20 rows, past the kernel's 16, so both forms run XLA's kernels
there, and the two columns differ by the machine's noise alone (1.88 / 2.31).

  .venv/bin/python benchmarks/verify_cost.py [--widths=1,3,5,9] [--batches=1,4] [--rounds=3]
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
from specjax.cpu_kernels import attention
from specjax.cpu_kernels import skinny_matmul
from specjax.models import gemma
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top
import timing  # noqa: E402  pylint: disable=g-import-not-at-top

WIDTHS = flags.DEFINE_list('widths', ['1', '3', '5', '9'], 'Positions per row in a call.')
BATCHES = flags.DEFINE_list('batches', ['1', '4'], 'Batch sizes.')
SLOTS = flags.DEFINE_integer('num_slots', 512, 'KV cache slots.')
ROUNDS = flags.DEFINE_integer('rounds', 3, 'Interleaved rounds; each figure is the best.')

# Each form's row limit for the skinny-matmul kernel and new tokens per row for
# the attention kernel (0: never), both read at trace time, which matrices
# the params carry int8 forms of (models/q8_weights), and whether the call
# gives the greedy loop's argmax instead of every logit.
FORMS = {'xla': (0, 0, None, False), 'kernel': (skinny_matmul.MAX_ROWS, 0, None, False),
         'kernels': (skinny_matmul.MAX_ROWS, attention.MAX_QUERIES, None, False),
         'q8 head': (skinny_matmul.MAX_ROWS, attention.MAX_QUERIES, ('embedding_VxD',), False),
         'q8': (skinny_matmul.MAX_ROWS, attention.MAX_QUERIES, q8_weights.SPLITTABLE, False),
         'q8 greedy': (skinny_matmul.MAX_ROWS, attention.MAX_QUERIES, q8_weights.SPLITTABLE,
                       True),
         # The same without Intel AMX's tile products (where the CPU has them): for the layers
         # (cpu_kernels/q8_amx) q8_matmul's float32 multiply-adds, for the head's argmax the
         # VNNI pass instead of the AMX screen (cpu_kernels/q8_argmax).
         'q8 greedy no amx': (skinny_matmul.MAX_ROWS, attention.MAX_QUERIES,
                              q8_weights.SPLITTABLE, True),
         # The layers' AMX products, and the head's argmax from the VNNI pass, not the screen.
         'q8 greedy vnni head': (skinny_matmul.MAX_ROWS, attention.MAX_QUERIES,
                                 q8_weights.SPLITTABLE, True)}
WITHOUT_AMX = ('q8 greedy no amx',)
WITHOUT_SCREEN = ('q8 greedy vnni head',)
PRODUCT = 'q8 greedy'
FORM_NAMES = flags.DEFINE_list('forms', list(FORMS), f'Forms to time (of {", ".join(FORMS)}); '
                               f'{PRODUCT!r} is always one.')


_PEAK_ROWS = 64


def matmul_params(params) -> int:
  """Parameters a position multiplies: every matrix, the tied table once (as the head)."""
  return sum(x.size for x in jax.tree.leaves(params) if x.ndim == 2)


def matmul_gflops(table_VxD) -> float:
  """The CPU's float32 matmul speed, on the head at 64 rows (compute-bound there, and XLA's)."""
  x_1xNxD = jnp.ones((1, _PEAK_ROWS, table_VxD.shape[1]), jnp.float32)
  head = jax.jit(lambda x, w: gemma.linear(x, w).max())
  return 2 * _PEAK_ROWS * table_VxD.size / timing.best_seconds(head, x_1xNxD, table_VxD) / 1e9


def _ratio(a: float, b: float | None) -> str:
  return '-' if b is None else f'{a / b:.2f}'


def main(argv):
  del argv
  print(cpu_info.describe())
  print(f'jax {jax.__version__}, backend {jax.default_backend()}; Gemma 3 270M float32, '
        f'{SLOTS.value} cache slots')
  config, params = checkpoints.load_checkpoint('embedded:gemma3-270m')
  model, params = LanguageModel(config), jax.device_put(params)
  global FORMS  # pylint: disable=global-statement
  unknown = set(FORM_NAMES.value) - set(FORMS)
  if unknown:
    raise SystemExit(f'unknown --forms {sorted(unknown)}; known: {", ".join(FORMS)}')
  FORMS = {f: v for f, v in FORMS.items() if f in FORM_NAMES.value or f == PRODUCT}
  form_params = {form: params if names is None else
                 jax.device_put(q8_weights.with_q8_weights(params, names))
                 for form, (_, _, names, _) in FORMS.items()}
  for form in set(WITHOUT_AMX) & set(FORMS):
    form_params[form] = jax.device_put(
        q8_weights.without_head_screen(q8_weights.without_amx(form_params[form])))
  for form in set(WITHOUT_SCREEN) & set(FORMS):
    form_params[form] = jax.device_put(q8_weights.without_head_screen(form_params[form]))
  if q8_weights.HEAD_FORM not in form_params[PRODUCT]:
    raise SystemExit('the head has no int8 form here (no kernel, or not the CPU backend)')
  widths = [int(w) for w in WIDTHS.value]
  batches = [int(b) for b in BATCHES.value]
  best = {}
  for round_index in range(ROUNDS.value):
    for form, (max_rows, max_queries, _, greedy) in FORMS.items():
      skinny_matmul.MAX_ROWS, attention.MAX_QUERIES = max_rows, max_queries
      jax.clear_caches()   # the kernels' limits are read when a program is traced
      for batch in batches:
        for width in widths:
          seconds = step_costs.seconds_per_call(model, form_params[form], width,
                                                batch=batch, num_slots=SLOTS.value,
                                                greedy=greedy)
          key = (batch, width, form)
          best[key] = min(best.get(key, float('inf')), seconds)
    print(f'round {round_index + 1} of {ROUNDS.value} done', flush=True)
  skinny_matmul.MAX_ROWS, attention.MAX_QUERIES = FORMS[PRODUCT][:2]
  flop_per_position = 2 * matmul_params(params)
  gflops = matmul_gflops(params['embedding_VxD'])
  print(f'\nmatmul speed (the head at {_PEAK_ROWS} rows): {gflops:.0f} GFLOP/s; '
        f'{flop_per_position / 1e9:.2f} GFLOP per position')
  print('\nEach "/ decode" is over the same form\'s own one-position call; "/ fastest" and "at peak"'
        ' over the fastest one-position call of any form.')
  print('\n| batch | positions | ' + ' | '.join(f'{f} ms | / decode' for f in FORMS)
        + f' | {PRODUCT} / fastest | {PRODUCT} / xla | at peak, no overlap |')
  print('|---' * (2 * len(FORMS) + 5) + '|')
  for batch in batches:
    fastest = min(best[(batch, 1, form)] for form in FORMS)
    for width in widths:
      cells = []
      for form in FORMS:
        ms = best[(batch, width, form)]
        cells.append(f'{ms * 1e3:.1f} | {ms / best[(batch, 1, form)]:.2f}')
      product = best[(batch, width, PRODUCT)]
      extra_seconds = batch * (width - 1) * flop_per_position / (gflops * 1e9)
      print(f'| {batch} | {width} | {" | ".join(cells)} | {product / fastest:.2f} | '
            f'{_ratio(product, best.get((batch, width, "xla")))} | {1 + extra_seconds / fastest:.2f} |')


if __name__ == '__main__':
  app.run(main)
