r"""Leviathan et al. 2023's analytic speedups, checked by simulation, as a Markdown table.

"Fast Inference from Transformers via Speculative Decoding" (Leviathan,
Kalman, Matias; ICML 2023) models each drafted token as accepted
independently with probability alpha (the acceptance rate). A target call
that verifies gamma drafts then yields the accepted prefix plus one corrected
or bonus token, on average

  E(alpha, gamma) = (1 - alpha^(gamma+1)) / (1 - alpha)      (their Eq. 1)

tokens, and if a draft step costs c target calls, walltime improves by

  S(alpha, gamma, c) = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))
                                                            (their Theorem 3.8).

For c > 0, S is quasi-concave in gamma (a concave numerator over a positive
affine denominator), so the best gamma is where S stops rising; for c = 0 it
rises towards 1 / (1 - alpha) without end, and the best gamma is `max_gamma`.
The model ignores prefill and assumes a verify call over gamma + 1 positions
costs one decode step; where it costs more, measured speedups fall below it.

  python -m specjax.analysis.leviathan --out=experiments/2026-12-leviathan-analytic/leviathan_analytic.md

writes the tables of E, S and the optimal gamma (in the manner of their
Figures 2 and 3) and a Monte-Carlo check of E under i.i.d. acceptance.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import sys
import time
from collections.abc import Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

ALPHAS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
GAMMAS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)
COSTS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
MAX_GAMMA = 64


def expected_tokens(alpha: float, gamma: int) -> float:
  """Tokens one target call yields on average: Eq. 1 (gamma + 1 at alpha = 1)."""
  _check(alpha, gamma)
  if alpha == 1.0:
    return gamma + 1.0
  return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, cost_ratio: float) -> float:
  """Theorem 3.8: speculative over plain decoding walltime, for drafts costing
  `cost_ratio` target calls each; also the predicted speedup of a measured run."""
  if cost_ratio < 0:
    raise ValueError(f'cost_ratio must be >= 0, got {cost_ratio}')
  return expected_tokens(alpha, gamma) / (gamma * cost_ratio + 1.0)


def optimal_gamma(alpha: float, cost_ratio: float, max_gamma: int = MAX_GAMMA) -> int:
  """The smallest gamma in [1, max_gamma] that maximises walltime_improvement.

  Climbs while S rises: S is quasi-concave in gamma, so the first gamma
  whose successor is no better is the global maximum. At cost_ratio 0 every
  draft helps (when alpha > 0), so the cap is the answer; climbing there
  would stop wherever alpha^gamma falls below float precision.
  """
  if cost_ratio == 0:
    return max_gamma if alpha > 0 else 1
  gamma = 1
  while (gamma < max_gamma and walltime_improvement(alpha, gamma + 1, cost_ratio)
         > walltime_improvement(alpha, gamma, cost_ratio)):
    gamma += 1
  return gamma


def expected_accepted(alpha: float, gamma: int) -> float:
  """Drafts accepted per target call: E - 1, the corrected or bonus token left out.

  Summed term by term: the closed form loses digits as alpha nears 1, where
  the bisection below needs them.
  """
  _check(alpha, gamma)
  return sum(alpha ** i for i in range(1, gamma + 1))


def alpha_from_counts(accepted_tokens: int, verify_calls: int, gamma: int) -> float:
  """The alpha under which i.i.d. acceptance gives the measured accepted drafts per call.

  A method-of-moments estimate: `expected_accepted` rises with alpha from 0
  to gamma, so bisection finds it. It is not accepted / drafted, which counts
  the drafts after a rejection (never examined) as rejected.
  """
  if verify_calls <= 0:
    raise ValueError(f'verify_calls must be positive, got {verify_calls}')
  per_call = accepted_tokens / verify_calls
  if not 0 <= per_call <= gamma:
    raise ValueError(f'{accepted_tokens} accepted drafts in {verify_calls} calls of gamma '
                     f'{gamma}: more than gamma per call')
  lo, hi = 0.0, 1.0
  for _ in range(60):  # 2^-60: far below any measured precision
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if expected_accepted(mid, gamma) < per_call else (lo, mid)
  return (lo + hi) / 2


@dataclasses.dataclass(frozen=True)
class Simulated:
  """Mean tokens per target call over `calls` simulated calls, with its standard error."""
  mean: float
  stderr: float
  calls: int


def simulate_tokens_per_call(alpha: float, gamma: int, calls: int,
                             rng: np.random.Generator) -> Simulated:
  """Draws `calls` verify calls whose drafts are each accepted with probability
  alpha, independently; each yields its accepted prefix plus one token."""
  _check(alpha, gamma)
  accept_CxG = rng.random((calls, gamma)) < alpha
  prefix_C = np.cumprod(accept_CxG, axis=1).sum(axis=1)  # drafts before the first rejection
  tokens_C = prefix_C + 1.0
  return Simulated(float(tokens_C.mean()), float(tokens_C.std(ddof=1) / np.sqrt(calls)), calls)


def _check(alpha, gamma) -> None:
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f'alpha must be in [0, 1], got {alpha}')
  if int(gamma) != gamma or gamma < 1:
    raise ValueError(f'gamma must be a positive integer, got {gamma}')


# ------------------------------------------------------------------- tables


def _grid(rows: Sequence[float], cols: Sequence, corner: str, col_name, cell) -> list[str]:
  lines = [f'| {corner} | ' + ' | '.join(col_name(c) for c in cols) + ' |',
           '|' + '---|' * (len(cols) + 1)]
  lines += [f'| {r:g} | ' + ' | '.join(cell(r, c) for c in cols) + ' |' for r in rows]
  return lines


def tokens_table(alphas=ALPHAS, gammas=GAMMAS) -> list[str]:
  return _grid(alphas, gammas, 'alpha \\ gamma', str,
               lambda a, g: f'{expected_tokens(a, g):.2f}')


def improvement_table(cost_ratio: float, alphas=ALPHAS, gammas=GAMMAS) -> list[str]:
  return _grid(alphas, gammas, 'alpha \\ gamma', str,
               lambda a, g: f'{walltime_improvement(a, g, cost_ratio):.2f}x')


def optimal_table(alphas=ALPHAS, costs=COSTS, max_gamma=MAX_GAMMA) -> list[str]:
  def cell(a, c):
    g = optimal_gamma(a, c, max_gamma)
    capped = '+' if g == max_gamma else ''
    return f'{g}{capped} ({walltime_improvement(a, g, c):.2f}x)'
  return _grid(alphas, costs, 'alpha \\ c', lambda c: f'c={c:g}', cell)


def simulation_table(alphas, gammas, calls: int, seed: int) -> list[str]:
  rng = np.random.default_rng(seed)
  lines = ['| alpha | gamma | Eq. 1 | simulated | std. error | z |', '|---|---|---|---|---|---|']
  for a in alphas:
    for g in gammas:
      sim = simulate_tokens_per_call(a, g, calls, rng)
      exact = expected_tokens(a, g)
      z = (sim.mean - exact) / sim.stderr if sim.stderr else 0.0
      lines.append(f'| {a:g} | {g} | {exact:.4f} | {sim.mean:.4f} | {sim.stderr:.4f} | {z:+.2f} |')
  return lines


def markdown(command: str, device: str, date: str, calls: int, seed: int) -> str:
  """The whole analytic report; the command, device and date head it."""
  parts = [
      '# Leviathan et al. 2023: analytic speedups of speculative decoding',
      '',
      f'Command: `{command}`  ',
      f'Device: {device}  ',
      f'Date: {date}',
      '',
      'Each drafted token is accepted independently with probability alpha; a draft step costs c '
      'target calls. E = (1 - alpha^(gamma+1)) / (1 - alpha) tokens per target call (their Eq. 1); '
      'walltime improvement S = E / (gamma c + 1) (their Theorem 3.8). Prefill is ignored and a '
      'verify call over gamma + 1 positions is taken to cost one decode step. Below 1.00x '
      'speculation loses; some gamma wins exactly when alpha > c (the "if" is their '
      'Corollary 3.9).',
      '',
      '## Expected tokens per target call, E(alpha, gamma)',
      '',
      *tokens_table(),
  ]
  for c in (0.01, 0.05, 0.1, 0.2, 0.5):
    parts += ['', f'## Walltime improvement at c = {c:g}', '', *improvement_table(c)]
  parts += [
      '', '## Optimal gamma (and its improvement) for each alpha and c', '',
      f'The smallest gamma in 1..{MAX_GAMMA} with the largest S; `+` marks the cap. At c = 0 '
      'every extra draft helps and S approaches 1 / (1 - alpha) (the E table above).', '',
      *optimal_table(),
      '', '## Monte-Carlo check of E under i.i.d. acceptance', '',
      f'{calls} simulated target calls per point (numpy default_rng seed {seed}); z = (simulated - '
      'Eq. 1) / standard error.', '',
      *simulation_table((0.5, 0.8, 0.95), (1, 4, 8), calls, seed),
  ]
  return '\n'.join(parts) + '\n'


def device_description() -> str:
  """Where the table was computed: it is plain numpy on the host CPU."""
  return (f'{platform.machine()} CPU, {os.cpu_count()} cores, {platform.system()}; '
          f'numpy {np.__version__}, Python {platform.python_version()}')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  out = flags.FLAGS.out
  if not out:
    raise app.UsageError('--out is required')
  start = time.perf_counter()
  command = 'python -m specjax.analysis.leviathan ' + ' '.join(sys.argv[1:])
  text = markdown(command, device_description(), datetime.date.today().isoformat(),
                  flags.FLAGS.calls, flags.FLAGS.seed)
  os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
  with open(out, 'w', encoding='utf-8') as f:
    f.write(text)
  logging.info('wrote %s in %.1f s', out, time.perf_counter() - start)


if __name__ == '__main__':
  # Defined here, not on import, so a notebook or report importing this module
  # does not claim the flag names.
  flags.DEFINE_string('out', None, 'Markdown file to write.')
  flags.DEFINE_integer('calls', 200_000, 'Simulated target calls per Monte-Carlo point.')
  flags.DEFINE_integer('seed', 0, 'Seed of the Monte-Carlo simulation.')
  app.run(main)
