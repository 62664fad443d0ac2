r"""Greedy's token from the 270M's head: the argmax kernel against the logits and their argmax.

`cpu_kernels/q8_argmax` finds each position's largest logit from int8-rounded
activations and a bound on their error, then computes exactly only the rows
whose bound reaches the best (the candidates). Its speed rests on how few
those are on real text, so this prints, on the final-norm hidden states of
raw-text Spec-Bench prompts (the first `--tokens` tokens of each, teacher
forced through the served model):

  1. the candidates per position under the VNNI pass's bound (l1max[o] times
     the row's summed per-block error, as q8_argmax.cc computes it), under
     the tighter per-block bound it does not use (sum_b l1[o, b] e_b, which
     would need a second table of the head's size / 32 to read), and, where
     the CPU has AMX-INT8, under the AMX screen's (its own table: the head
     rounded to int8 with a scale a row, x as 2-byte integers);
  2. how many positions' index or value differs between each kernel and
     `q8_matmul`'s logits with `argmax.argmax` (it must be none);
  3. the head's time at 1 / 5 / 9 / 20 / 36 rows each way, interleaved,
     best of `--repeats`.

On the 2-core Xeon of 6 December 2026 (1,027 positions of 12 prompts): the
VNNI pass's bound left 6 candidates at the median, 22 at the 90th percentile
and 521 at most, the per-block one 3 / 12 / 175, the screen's 14 / 54 / 582;
no position differed; the head took 5.76 / 6.36 / 7.45 / 11.03 / 17.18 ms at
1 / 5 / 9 / 20 / 36 rows with the VNNI pass, 4.98 / 5.51 / 6.02 / 7.72 / 11.85
with the screen, and 7.38 / 9.68 / 14.30 / 31.62 / 64.13 as logits and their
argmax (the three interleaved, so each reads the head from memory, as in a
forward pass: timed alone, each call finds much of it in the 300 MB L3 and
runs faster).

With `--screen_bits`, on any CPU, the candidates under the screen's bound with x
rounded to fewer bits, one unit a row. On the 2-core Zen 4 of 7 December 2026
(no AMX; experiments/2026-12-zen4-gemma270m-cpu/head_argmax_screen_bits.txt),
one signed byte (7 bits, what a VNNI pass over the screen would take: x + 128
against the table's bytes) left 5,378 candidates at the median and 38,131 at
the 90th percentile; 9 bits 66 / 475, 10 bits 30 / 154, 14 bits 14 / 54. One
unit a row spends x's bits on its largest feature, and Gemma's final hidden
state has a few far larger than the rest; the per-block steps of the tiles'
pass do not.

  .venv/bin/python benchmarks/head_argmax.py [--prompts=12] [--tokens=200] [--repeats=7] \
      [--screen_bits=7,9,10,14]
"""

from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from specjax import argmax as argmax_lib
from specjax.cpu_kernels import q8_argmax
from specjax.cpu_kernels import q8_matmul
from specjax.experiments import loading
from specjax.experiments import prompts as prompts_lib
from specjax import checkpoints
from specjax.checkpoints import embedded
from specjax.models import q8_weights
from specjax.models.language_model import LanguageModel
from specjax.tokenizer import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu_info  # noqa: E402  pylint: disable=g-import-not-at-top

_SPEC_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'shared',
                           'data', 'spec_bench_question.jsonl')
PROMPTS_FILE = flags.DEFINE_string('prompts_file', _SPEC_BENCH, 'Spec-Bench question.jsonl.')
NUM_PROMPTS = flags.DEFINE_integer('prompts', 12, 'Prompts, spread evenly over the file.')
TOKENS = flags.DEFINE_integer('tokens', 200, 'Tokens of each prompt (raw text) run through.')
ROWS = flags.DEFINE_list('rows', ['1', '5', '9', '20', '36'], 'Rows (positions) per timed call.')
REPEATS = flags.DEFINE_integer('repeats', 7, 'Timed calls of each; the best is printed.')
SCREEN_BITS = flags.DEFINE_list(
    'screen_bits', [], 'Also count candidates under the screen\'s bound with x rounded to these '
    'many bits, one unit a row (7: one signed byte, what a VNNI pass over the screen would take; '
    'the AMX pass keeps 14), on any CPU.')


def hidden_states(model, params, tokenizer) -> np.ndarray:
  """[N, D] final-norm hidden states of the chosen prompts' first tokens."""
  prompts = prompts_lib.load_prompts(PROMPTS_FILE.value)
  step = max(1, len(prompts) // NUM_PROMPTS.value)
  out = []
  for p in prompts[::step][:NUM_PROMPTS.value]:
    ids = tokenizer.encode(p.text, add_bos=True)[:TOKENS.value]
    n = len(ids)
    forward = model.forward(params, jnp.asarray([ids]), jnp.arange(n)[None],
                            model.init_cache(1, n + 2), logits=False)
    out.append(np.asarray(forward.hidden_BxTxD[0]))
  return np.concatenate(out)


def candidate_counts(h_NxD: np.ndarray, q_VxD: np.ndarray, scale_VxB: np.ndarray):
  """Candidates per position under the kernel's bound and under the per-block one."""
  v, d = q_VxD.shape
  blocks = scale_VxB.shape[1]
  w_VxD = (q_VxD.astype(np.float32).reshape(v, blocks, -1) * scale_VxB[:, :, None]).reshape(v, d)
  l1_VxB = np.abs(q_VxD.astype(np.float32)).reshape(v, blocks, -1).sum(-1) * scale_VxB
  l1max_V = l1_VxB.max(1)
  kernel, per_block = [], []
  for x in h_NxD:
    x_BxK = x.reshape(blocks, -1)
    amax_B = np.abs(x_BxK).max(1)
    step_B = amax_B / 127
    xq = (np.round(x_BxK / np.where(step_B > 0, step_B, 1)[:, None]) * step_B[:, None]).reshape(-1)
    e_B = step_B / 2 + 2.0 ** -16 * (amax_B + step_B)
    approx_V = w_VxD @ xq
    for bound_V, counts in ((l1max_V * e_B.sum(), kernel), (l1_VxB @ e_B, per_block)):
      counts.append(int(np.sum(approx_V + bound_V >= np.max(approx_V - bound_V))))
  return np.asarray(kernel), np.asarray(per_block)


def screen_candidate_counts(h_NxD: np.ndarray, q_VxD: np.ndarray, scale_VxB: np.ndarray,
                            kept_bits: int = 14) -> tuple[np.ndarray, np.ndarray]:
  """Candidates per position under the AMX screen's bound (q8_argmax.cc's `screen_row`) with
  x as integers of `kept_bits` (the screen's 14: two bytes), and per position the share of
  4-input groups where some |X| >= 128 (that one signed byte cannot hold)."""
  v, d = q_VxD.shape
  screen, meta = q8_argmax.screen_form(q_VxD, scale_VxB)
  r_VxD = screen.reshape(v // 16, d // 4, 16, 4).transpose(0, 2, 1, 3).reshape(v, d)
  s_V, l1_V, err_V = meta.reshape(v // 16, 3, 16).transpose(1, 0, 2).reshape(3, v)
  r_VxD = r_VxD.astype(np.float32)   # float32 sums, rounded as the kernel's a[o] may be
  counts, wide = [], []
  for start in range(0, len(h_NxD), 64):
    x_NxD = h_NxD[start:start + 64]
    amax_N = np.abs(x_NxD).max(1).astype(np.float64)
    unit_N = 2.0 ** (np.frexp(amax_N)[1] - kept_bits)
    X_NxD = np.rint(x_NxD / unit_N[:, None])
    sums_VxN = (r_VxD @ X_NxD.T.astype(np.float32)).astype(np.float64)
    for n in range(len(x_NxD)):
      approx_V = s_V * sums_VxN[:, n] * unit_N[n]
      per_l1 = (unit_N[n] / 2 + amax_N[n] / 65536) * (1 + 1 / 16)
      per_err = (unit_N[n] * np.abs(X_NxD[n]).sum() + d * amax_N[n] / 2 ** 20) * (1 + 1 / 16)
      bound_V = l1_V * per_l1 + err_V * per_err
      counts.append(int(np.sum(approx_V + bound_V >= np.max(approx_V - bound_V))))
      wide.append(float((np.abs(X_NxD[n]) >= 128).reshape(-1, 4).any(1).mean()))
  return np.asarray(counts), np.asarray(wide)


def _summary(counts: np.ndarray) -> str:
  return (f'median {np.median(counts):.0f}, 90th percentile {np.percentile(counts, 90):.0f}, '
          f'99th {np.percentile(counts, 99):.0f}, most {counts.max()}')


def main(argv):
  del argv
  print(cpu_info.describe())
  if not q8_argmax.available():
    raise SystemExit('the q8_argmax kernel is not available here (it needs AVX-512 VNNI or '
                     'AVX2)')
  config, params = checkpoints.load_checkpoint(embedded.EMBEDDED_NAME)
  model = LanguageModel(config)
  # As the product serves it: the int8 forms and the head's tiles, from the weight cache.
  params = jax.device_put(q8_weights.with_q8_weights(
      params, forms=loading.cached_forms(embedded.EMBEDDED_NAME, params)))
  tokenizer = Tokenizer.from_gguf(embedded.default_gguf_path())
  q, scale = params[q8_weights.HEAD_FORM], params[q8_weights.HEAD_SCALE]
  tiles = q8_argmax.tile_form(np.asarray(q), np.asarray(scale))   # the VNNI pass's layout
  h_NxD = hidden_states(model, params, tokenizer)
  print(f'\n{len(h_NxD)} positions of {NUM_PROMPTS.value} raw-text Spec-Bench prompts '
        f'(up to {TOKENS.value} tokens each)')
  kernel, per_block = candidate_counts(h_NxD, np.asarray(q), np.asarray(scale))
  print(f'candidates, the kernel\'s bound: {_summary(kernel)}')
  print(f'candidates, the per-block bound: {_summary(per_block)}')

  screen_arrays = q8_argmax.screen_form(np.asarray(q), np.asarray(scale))
  if q8_argmax.screen_available():
    print(f'candidates, the AMX screen\'s bound: '
          f'{_summary(screen_candidate_counts(h_NxD, np.asarray(q), np.asarray(scale))[0])}')
  for bits in (int(b) for b in SCREEN_BITS.value):
    counts, wide = screen_candidate_counts(h_NxD, np.asarray(q), np.asarray(scale), bits)
    print(f'candidates, the screen\'s bound with x in {bits} bits: {_summary(counts)}; '
          f'4-input groups past one byte: mean {wide.mean():.3f}, most {wide.max():.3f}')

  by_kernel = jax.jit(lambda x: q8_argmax.head_argmax(x, *tiles, q, scale))
  by_screen = (jax.jit(lambda x: q8_argmax.screen_argmax(x, *screen_arrays, q, scale))
               if q8_argmax.screen_available() else None)

  @jax.jit
  def by_logits(x):
    logits = q8_matmul.q8_matmul(x, q, scale)
    return argmax_lib.argmax(logits), jnp.max(logits, axis=-1)

  fns = {'kernel': by_kernel, 'logits': by_logits}
  if by_screen is not None:
    fns['screen'] = by_screen
  for name in set(fns) - {'logits'}:
    differ = 0
    for start in range(0, len(h_NxD), 32):
      x = jnp.asarray(h_NxD[start:start + 32])
      (i_a, v_a), (i_b, v_b) = fns[name](x), by_logits(x)
      differ += int(np.sum((np.asarray(i_a) != np.asarray(i_b))
                           | (np.asarray(v_a) != np.asarray(v_b))))
    print(f'{name}: positions whose index or value differs from the logits\' argmax: {differ} '
          f'of {len(h_NxD)}')

  screen_head = ' AMX screen ms | screen / VNNI |' if by_screen else ''
  print(f'\n| rows | argmax kernel (VNNI) ms | logits + argmax ms | VNNI / logits |{screen_head}\n'
        + '|---' * (6 if by_screen else 4) + '|')
  for rows in (int(r) for r in ROWS.value):
    x = jnp.asarray(h_NxD[:rows])
    best = dict.fromkeys(fns, float('inf'))
    for fn in fns.values():
      jax.block_until_ready(fn(x))
    for _ in range(REPEATS.value):
      for name, fn in fns.items():   # interleaved: a slow spell falls on both
        start = time.perf_counter()
        jax.block_until_ready(fn(x))
        best[name] = min(best[name], time.perf_counter() - start)
    screen_cells = (f' {best["screen"] * 1e3:.2f} | {best["screen"] / best["kernel"]:.2f} |'
                    if by_screen else '')
    print(f'| {rows} | {best["kernel"] * 1e3:.2f} | {best["logits"] * 1e3:.2f} | '
          f'{best["kernel"] / best["logits"]:.2f} |{screen_cells}')


if __name__ == '__main__':
  app.run(main)
