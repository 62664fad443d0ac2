"""Leviathan et al.'s formulas: the tables hold them, simulation agrees, the optimum is the best.

The simulation checks can fail: each compares the formula with i.i.d.
acceptance simulated directly, and the same check must reject the formula
moved one step in gamma (the off-by-one a bonus token invites).
"""

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from specjax.analysis import leviathan

ROOT = pathlib.Path(__file__).resolve().parents[1]
COMMITTED = ROOT / 'experiments' / '2026-12-leviathan-analytic' / 'leviathan_analytic.md'


def series(alpha, gamma):
  """E as the sum it comes from: draft i+1 is reached with probability alpha^i."""
  return sum(alpha ** i for i in range(gamma + 1))


def table_after(text, heading):
  """The cells of the first Markdown table after `heading`, keyed by (row label, column label)."""
  lines = text[text.index(heading):].splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith('|'))
  header = [c.strip() for c in lines[start].strip('|').split('|')]
  cells = {}
  for line in lines[start + 2:]:
    if not line.startswith('|'):
      break
    values = [c.strip() for c in line.strip('|').split('|')]
    cells.update({(values[0], col): value for col, value in zip(header[1:], values[1:])})
  return cells


def test_expected_tokens_is_the_series():
  for alpha in (0.0, 0.1, 0.5, 0.9, 0.999, 1.0):
    for gamma in (1, 2, 5, 12):
      assert leviathan.expected_tokens(alpha, gamma) == pytest.approx(series(alpha, gamma))
      assert leviathan.walltime_improvement(alpha, gamma, 0.25) == pytest.approx(
          series(alpha, gamma) / (1 + 0.25 * gamma))


@pytest.mark.parametrize('alpha, gamma', [(-0.1, 2), (1.1, 2), (0.5, 0), (0.5, 2.5)])
def test_bad_arguments_are_refused(alpha, gamma):
  with pytest.raises(ValueError):
    leviathan.expected_tokens(alpha, gamma)


def test_tables_equal_the_formulas():
  text = leviathan.markdown('cmd', 'dev', '2026-01-01', calls=1000, seed=0)
  cells = table_after(text, '## Expected tokens')
  assert len(cells) == len(leviathan.ALPHAS) * len(leviathan.GAMMAS)
  for a in leviathan.ALPHAS:
    for g in leviathan.GAMMAS:
      assert cells[(f'{a:g}', str(g))] == f'{series(a, g):.2f}'
  for c in (0.01, 0.05, 0.1, 0.2, 0.5):
    cells = table_after(text, f'## Walltime improvement at c = {c:g}\n')
    assert len(cells) == len(leviathan.ALPHAS) * len(leviathan.GAMMAS)
    for a in leviathan.ALPHAS:
      for g in leviathan.GAMMAS:
        assert cells[(f'{a:g}', str(g))] == f'{series(a, g) / (g * c + 1):.2f}x'
  cells = table_after(text, '## Optimal gamma')
  for a in leviathan.ALPHAS:
    for c in leviathan.COSTS:
      best = max(range(1, leviathan.MAX_GAMMA + 1), key=lambda g: (series(a, g) / (g * c + 1), -g))
      assert cells[(f'{a:g}', f'c={c:g}')] == f'{best} ({series(a, best) / (best * c + 1):.2f}x)'


def z_scores(formula, alphas=(0.3, 0.6, 0.8, 0.9, 0.95), gammas=(1, 2, 4, 8), calls=50_000):
  rng = np.random.default_rng(1234)
  out = []
  for a in alphas:
    for g in gammas:
      sim = leviathan.simulate_tokens_per_call(a, g, calls, rng)
      out.append((sim.mean - formula(a, g)) / sim.stderr)
  return np.array(out)


def test_simulation_agrees_with_eq1_within_its_standard_error():
  assert np.abs(z_scores(leviathan.expected_tokens)).max() < 4.5


@pytest.mark.parametrize('shift', [-1, 1])
def test_simulation_rejects_eq1_off_by_one_in_gamma(shift):
  wrong = lambda a, g: series(a, g + shift)
  assert np.abs(z_scores(wrong)).max() > 10


def test_simulation_standard_error_is_honest():
  """Over many seeds about 95% of simulated means fall within 1.96 standard errors."""
  rng = np.random.default_rng(7)
  inside = [abs(s.mean - leviathan.expected_tokens(0.7, 4)) < 1.96 * s.stderr
            for s in (leviathan.simulate_tokens_per_call(0.7, 4, 2000, rng) for _ in range(400))]
  assert 0.91 < np.mean(inside) < 0.99


def test_optimal_gamma_matches_brute_force():
  max_gamma = 200
  for alpha in np.linspace(0.02, 0.99, 50):
    for c in (0.001, 0.01, 0.03, 0.1, 0.3, 0.7, 1.0, 2.0):
      values = [leviathan.walltime_improvement(alpha, g, c) for g in range(1, max_gamma + 1)]
      assert leviathan.optimal_gamma(alpha, c, max_gamma) == 1 + int(np.argmax(values)), (alpha, c)


def test_optimal_gamma_at_zero_cost_is_the_cap():
  assert leviathan.optimal_gamma(0.5, 0.0, max_gamma=32) == 32
  assert leviathan.optimal_gamma(0.0, 0.0, max_gamma=32) == 1


def test_alpha_from_counts_inverts_the_expectation():
  for alpha in (0.05, 0.3, 0.77, 0.99):
    for gamma in (1, 3, 8):
      calls = 1000
      accepted = leviathan.expected_accepted(alpha, gamma) * calls
      assert leviathan.alpha_from_counts(accepted, calls, gamma) == pytest.approx(alpha, abs=1e-9)
  assert leviathan.alpha_from_counts(0, 10, 4) == pytest.approx(0.0, abs=1e-9)
  assert leviathan.alpha_from_counts(40, 10, 4) == pytest.approx(1.0, abs=1e-9)
  with pytest.raises(ValueError, match='more than gamma'):
    leviathan.alpha_from_counts(41, 10, 4)


def test_alpha_from_simulated_counts():
  """Counts drawn with a known alpha give it back; accepted / drafted would not."""
  rng = np.random.default_rng(3)
  alpha, gamma, calls = 0.7, 4, 100_000
  accepted = np.cumprod(rng.random((calls, gamma)) < alpha, axis=1).sum()
  assert leviathan.alpha_from_counts(int(accepted), calls, gamma) == pytest.approx(alpha, abs=0.005)
  assert accepted / (calls * gamma) < alpha - 0.1


def test_command_writes_the_table_with_its_provenance(tmp_path):
  out = tmp_path / 'sub' / 'table.md'
  subprocess.run([sys.executable, '-m', 'specjax.analysis.leviathan', f'--out={out}',
                  '--calls=2000'], check=True, cwd=ROOT, capture_output=True)
  text = out.read_text()
  assert f'Command: `python -m specjax.analysis.leviathan --out={out} --calls=2000`' in text
  assert re.search(r'^Device: .*cores', text, re.M)
  assert re.search(r'^Date: \d{4}-\d\d-\d\d$', text, re.M)
  assert '## Monte-Carlo check' in text


def test_committed_table_is_what_the_code_computes():
  committed = COMMITTED.read_text()
  fresh = leviathan.markdown('cmd', 'dev', 'date', calls=1000, seed=0)
  body = lambda text: text[text.index('## Expected'):text.index('## Monte-Carlo')]
  assert body(committed) == body(fresh)
